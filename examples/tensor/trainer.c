/* The command line and main of the example trainers (see trainer.h). */
#include "trainer.h"

#include <adg.h>
#include <cblas.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

/* Every option; --train-subset only for a trainer that takes it. */
static const struct option all_options[] = {
	{"threads", required_argument, NULL, 't'},
	{"mode", required_argument, NULL, 'o'},
	{"batch", required_argument, NULL, 'b'},
	{"unit-rows", required_argument, NULL, 'u'},
	{"sum", required_argument, NULL, 'S'},
	{"epochs", required_argument, NULL, 'e'},
	{"lr", required_argument, NULL, 'l'},
	{"seed", required_argument, NULL, 's'},
	{"train-subset", required_argument, NULL, 'n'},
	{"csv", required_argument, NULL, 'c'},
	{"export", required_argument, NULL, 'x'},
	{"min-test-accuracy", required_argument, NULL, 'm'},
	{"same-weights", no_argument, NULL, 'w'},
	{"profile", no_argument, NULL, 'p'},
	{"skip-if-missing", no_argument, NULL, 'k'},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0}};

#define N_OPTIONS (sizeof all_options / sizeof *all_options)

/* Takes option c's argument into *o: 0 when it is one, -1 when not,
 * 1 when c is an option without one or a switch it set. */
static int take_value(int c, const char *arg, struct trainer_options *o)
{
	char *end = NULL;
	switch (c) {
	case 't':
		o->n_runs = parse_threads(arg, o->threads, MAX_RUNS);
		return o->n_runs < 0 ? -1 : 0;
	case 'o':
		return parse_mode(arg, &o->mode);
	case 'S':
		if (strcmp(arg, "tree") != 0 && strcmp(arg, "exact") != 0)
			return -1;
		o->exact = strcmp(arg, "exact") == 0;
		return 0;
	case 'c':
		o->csv = arg;
		return 0;
	case 'x':
		o->export_path = arg;
		return 0;
	case 'b':
		o->batch = (int)strtol(arg, &end, 10);
		break;
	case 'u':
		o->unit_rows = (int)strtol(arg, &end, 10);
		break;
	case 'e':
		o->epochs = (int)strtol(arg, &end, 10);
		break;
	case 'l':
		o->lr = strtod(arg, &end);
		break;
	case 's':
		o->seed = strtoull(arg, &end, 10);
		break;
	case 'n':
		o->train_subset = (int)strtol(arg, &end, 10);
		break;
	case 'm':
		o->min_test_accuracy = strtod(arg, &end);
		break;
	default:
		return -1;
	}
	return end == arg || *end != '\0' ? -1 : 0;
}

/* Parses argv into *o, from t's defaults; prints the help and exits 0
 * on --help. Returns 0, or -1 on bad usage. */
static int parse_options(const struct trainer *t, int argc, char **argv,
			 struct trainer_options *o)
{
	struct option longs[N_OPTIONS];
	size_t n = 0;
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (all_options[i].val != 'n' || t->takes_train_subset)
			longs[n++] = all_options[i];
	*o = (struct trainer_options){.threads = {1},
				      .n_runs = 1,
				      .mode = t->mode,
				      .batch = t->batch,
				      .unit_rows = t->unit_rows,
				      .epochs = t->epochs,
				      .lr = t->lr,
				      .seed = 1,
				      .min_test_accuracy = -1};
	int c;
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		if (c == 'w')
			o->same_weights = 1;
		else if (c == 'p')
			o->profile = 1;
		else if (c == 'k')
			o->skip_if_missing = 1;
		else if (c == 'h') {
			t->usage(stdout);
			exit(0);
		} else if (take_value(c, optarg, o) != 0)
			return -1;
	}
	if (optind != argc - 1 || o->batch < 1 || o->batch > 4096 ||
	    o->epochs < 1 || o->epochs > 10000 || o->train_subset < 0 ||
	    o->unit_rows < 0 || o->unit_rows > 4096 ||
	    (o->exact && (o->mode != MODE_SYNC || o->unit_rows == 0)) ||
	    t->check(o) != 0)
		return -1;
	o->data = argv[optind];
	return 0;
}

/* Trains a fresh model (the same initial weights every run) on n_threads
 * threads; returns 0, or 1 on an error (printed). */
static int run(const struct trainer *t, const struct trainer_options *o,
	       struct model *m, const struct dataset *train,
	       const struct dataset *test, int n_threads, FILE *csv,
	       struct outcome *outcome)
{
	struct runner r = {.ops = t->ops,
			   .model = m,
			   .train = train,
			   .test = test,
			   .mode = o->mode,
			   .n_threads = n_threads,
			   .batch = o->batch,
			   .epochs = o->epochs,
			   .first_lr = o->lr,
			   .seed = o->seed,
			   .name_mode = t->name_mode,
			   .slice_from = t->slice_from,
			   .unit_rows = o->unit_rows,
			   .exact = o->exact,
			   .profile = o->profile};
	model_init(m, o->seed);
	return runner_run(&r, csv, outcome);
}

/* One run per thread count of --threads, each checked against
 * --min-test-accuracy and --same-weights; returns 0, or 1 on an error
 * or a missed check (printed). */
static int run_all(const struct trainer *t, const struct trainer_options *o,
		   struct model *m, const struct dataset *train,
		   const struct dataset *test, FILE *csv)
{
	struct outcome outcomes[MAX_RUNS];
	int failed = 0;
	for (int r = 0; r < o->n_runs && !failed; r++) {
		struct outcome *out = &outcomes[r];
		failed = run(t, o, m, train, test, o->threads[r], csv, out);
		if (!failed && o->min_test_accuracy >= 0 &&
		    out->accuracy < o->min_test_accuracy) {
			fprintf(stderr,
				"T=%d: test accuracy %.2f%% is below %.2f%%\n",
				o->threads[r], out->accuracy,
				o->min_test_accuracy);
			failed = 1;
		}
		if (!failed && o->same_weights)
			failed = runner_same_weights(o->threads, outcomes, r,
						     o->mode == MODE_SYNC &&
							     o->unit_rows > 0);
	}
	return failed;
}

/* Makes the model, then exports its setup or trains it; returns 0, or 1
 * on an error or a missed check (printed). */
static int export_or_train(const struct trainer *t,
			   const struct trainer_options *o,
			   const struct dataset *train,
			   const struct dataset *test)
{
	struct model m;
	int failed = 0;
	int rc = model_new(&m, t->shapes, t->n_params);
	if (rc != 0) {
		fprintf(stderr, "model: %s\n", adg_strerror(rc));
		failed = 1;
	}
	int export_only = o->export_path != NULL;
	if (!failed && export_only)
		failed = t->export_setup(o, &m, train) != 0;
	FILE *csv = NULL;
	if (!failed && !export_only && o->csv != NULL)
		failed = (csv = runner_csv(o->csv)) == NULL;
	if (!failed && !export_only)
		failed = run_all(t, o, &m, train, test, csv);
	if (csv != NULL && (ferror(csv) | fclose(csv))) {
		fprintf(stderr, "%s: write failed\n", o->csv);
		failed = 1;
	}
	if (model_free(&m) != 0)
		failed = 1;
	return failed;
}

int trainer_main(const struct trainer *t, int argc, char **argv)
{
	struct trainer_options o;
	if (parse_options(t, argc, argv, &o) != 0) {
		t->usage(stderr);
		return 2;
	}
	/* The threads here are the parallelism: each BLAS call multiplies
	 * the matrices of one thread's batch or share of one. OpenBLAS's
	 * own pool would only hand them between threads (and
	 * ThreadSanitizer cannot see into its uninstrumented workers), so
	 * BLAS runs on the calling thread. OPENBLAS_NUM_THREADS=1 keeps the
	 * pool from even starting when the library loads; this covers a
	 * run without it. */
	openblas_set_num_threads(1);

	struct dataset train = {0}, test = {0};
	int rc = t->load(&o, &train, &test);
	if (rc == 0) {
		printf("%s: %d training images, %d test images\n", o.data,
		       train.n, test.n);
		rc = export_or_train(t, &o, &train, &test);
	} else {
		rc = rc == -2 && o.skip_if_missing ? 77 : 1;
	}
	dataset_free(&train);
	dataset_free(&test);
	return rc;
}
