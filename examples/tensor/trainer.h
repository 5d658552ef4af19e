/* What the example trainers (examples/digits, examples/fashion) share of
 * their command line and main: the options they both take, their
 * parsing, and a main that loads the data, then exports a setup for
 * bench/compare/ or runs the runner (runner.h) once per thread count and
 * checks the results. A trainer gives what differs: its model, its data,
 * its defaults, its help text and its export (struct trainer). */
#ifndef EXAMPLES_TRAINER_H
#define EXAMPLES_TRAINER_H

#include "runner.h"

#include <stdint.h>
#include <stdio.h>

#define MAX_RUNS 16 /* thread counts in one --threads list */

/* The options of a trainer (docs/trainers.md). */
struct trainer_options {
	const char *data, *csv;
	const char *export_path; /* --export: a file or a folder */
	int threads[MAX_RUNS], n_runs;
	int batch, epochs;
	int train_subset; /* 0: every training example */
	int unit_rows;	  /* sync: rows per unit; 0: a share per thread */
	int exact;	  /* sync with units: exact sums (--sum exact) */
	int profile;	  /* sync: where a round's time goes (--profile) */
	enum train_mode mode;
	double lr; /* the first epoch's; see learning_rate */
	uint64_t seed;
	double min_test_accuracy; /* %, or negative: no check */
	int skip_if_missing, same_weights;
};

/* What differs between trainers. */
struct trainer {
	const struct train_ops *ops;
	const struct param_shape *shapes; /* the model's, for model_new */
	int n_params;
	/* The options' defaults. */
	enum train_mode mode;
	int batch, epochs, unit_rows;
	double lr;
	int takes_train_subset; /* whether --train-subset is an option */
	/* Passed on to the runner (struct runner). */
	int name_mode;
	size_t slice_from;
	/* Prints the help text to `to`. */
	void (*usage)(FILE *to);
	/* Checks what the shared parsing cannot, the learning rate's range
	 * (and fills in its default where it depends on others); returns
	 * 0, or -1 on bad usage. */
	int (*check)(struct trainer_options *o);
	/* Reads o->data into train and test. Returns 0, or prints what is
	 * wrong and returns -1 (-2 when the data does not exist). */
	int (*load)(const struct trainer_options *o, struct dataset *train,
		    struct dataset *test);
	/* --export: writes the initial weights (after model_init), the
	 * learning rates and the orders to o->export_path for
	 * bench/compare/. Returns 0 or -1 (printed). */
	int (*export_setup)(const struct trainer_options *o, struct model *m,
			    const struct dataset *train);
};

/* The whole of a trainer's main: parses the options (exits 0 after
 * --help; 2 on bad usage), loads the data, and exports or trains.
 * Returns main's exit status: 0; 1 on an error or a missed
 * --min-test-accuracy or --same-weights; 2 on bad usage; 77 when the
 * data is missing and --skip-if-missing is given. */
int trainer_main(const struct trainer *t, int argc, char **argv);

#endif /* EXAMPLES_TRAINER_H */
