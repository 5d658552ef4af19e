/* Corpus replay: runs the differential fuzzer's core (tests/fuzz/driver.h)
 * over every file of the seed corpus, so that every build of the suite
 * checks libadg against the reference model. A difference aborts the test
 * with a report on stderr naming the file and the operation. */
#include "driver.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#ifndef ADG_FUZZ_CORPUS
#error "tests/meson.build passes ADG_FUZZ_CORPUS, the corpus folder"
#endif

/* The corpus holds a few dozen files of a few hundred bytes. */
#define MAX_FILES 256
#define MAX_SIZE  (1 << 20)

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The corpus file names, sorted so that every run replays in one order. */
static size_t list_corpus(char **names)
{
	DIR *dir = opendir(ADG_FUZZ_CORPUS);
	cr_assert_not_null(dir, "cannot open %s", ADG_FUZZ_CORPUS);
	size_t n = 0;
	struct dirent *e;
	while ((e = readdir(dir)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		cr_assert(n < MAX_FILES, "more corpus files than expected");
		names[n] = strdup(e->d_name);
		cr_assert_not_null(names[n]);
		n++;
	}
	closedir(dir);
	qsort(names, n, sizeof *names, by_name);
	return n;
}

static size_t read_file(const char *name, uint8_t *buf)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", ADG_FUZZ_CORPUS, name);
	FILE *fp = fopen(path, "rb");
	cr_assert_not_null(fp, "cannot open %s", path);
	size_t size = fread(buf, 1, MAX_SIZE, fp);
	cr_assert(feof(fp), "%s is larger than %d bytes", path, MAX_SIZE);
	fclose(fp);
	return size;
}

Test(replay, corpus, .timeout = 600)
{
	char *names[MAX_FILES];
	size_t n = list_corpus(names);
	cr_assert(n >= 20, "only %zu corpus files in %s", n, ADG_FUZZ_CORPUS);
	uint8_t *buf = malloc(MAX_SIZE);
	cr_assert_not_null(buf);
	struct adg_fuzz_coverage cov = {0};
	for (size_t i = 0; i < n; i++) {
		/* Named first: a mismatch aborts inside adg_fuzz_run. */
		fprintf(stderr, "replay: %s\n", names[i]);
		adg_fuzz_run(buf, read_file(names[i], buf), &cov);
		free(names[i]);
	}
	free(buf);
	/* The corpus is meant to reach every kind of operation and outcome:
	 * a regenerated corpus that stops doing so fails here. */
	fprintf(stderr, "replay: %zu files, coverage:", n);
#define SHOW(name)                                                             \
	fprintf(stderr, " " #name "=%llu", (unsigned long long)cov.name);
	ADG_FUZZ_COVERAGE(SHOW)
#undef SHOW
	fputc('\n', stderr);
#define COVERED(name) cr_expect(cov.name > 0, "the corpus has no " #name);
	ADG_FUZZ_COVERAGE(COVERED)
#undef COVERED
	/* Every executor mode, consuming and retained: x can say each, and a
	 * combination no file runs is one only random inputs would reach. */
	fprintf(stderr, "replay: backwards by W (consuming/retained):");
	for (unsigned w = 0; w < ADG_FUZZ_EXEC_MODES; w++)
		fprintf(stderr, " W%u=%llu/%llu", w,
			(unsigned long long)cov.by_mode[w][0],
			(unsigned long long)cov.by_mode[w][1]);
	fputc('\n', stderr);
	for (unsigned w = 0; w < ADG_FUZZ_EXEC_MODES; w++)
		for (unsigned r = 0; r < 2; r++)
			cr_expect(cov.by_mode[w][r] > 0,
				  "the corpus has no %s backward with W %u",
				  r ? "retained" : "consuming", w);
#if defined(__SANITIZE_ADDRESS__)
	cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "heap leak");
#endif
}
