/* The TSan build's test runner: see criterion/criterion.h. */
#define _GNU_SOURCE /* FNM_EXTMATCH, for Criterion's !(...) and @(...) */
#include "criterion/criterion.h"

#include <fnmatch.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static struct runner_suite *suites;
static struct runner_test *tests;
static atomic_bool failed;

void runner_add_suite(struct runner_suite *s)
{
	s->next = suites;
	suites = s;
}

void runner_add_test(struct runner_test *t)
{
	t->next = tests;
	tests = t;
}

void runner_fail(bool fatal, const char *file, int line, const char *expr,
		 const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	/* Every message starts with the space RUNNER_CHECK puts first. */
	const char *text = msg[0] == ' ' ? msg + 1 : msg;
	fprintf(stderr, "[----] %s:%d: check failed: %s%s%s\n", file, line,
		expr, *text ? ": " : "", text);
	atomic_store(&failed, true);
	if (fatal) {
		fflush(NULL);
		_exit(1); /* from any thread: the test's process ends here */
	}
}

static struct runner_suite *suite_of(const struct runner_test *t)
{
	for (struct runner_suite *s = suites; s != NULL; s = s->next)
		if (strcmp(s->name, t->suite) == 0)
			return s;
	return NULL;
}

static void run_child(const struct runner_test *t, const struct runner_suite *s)
{
	double timeout = t->timeout	   ? t->timeout
			 : s && s->timeout ? s->timeout
					   : 600;
	alarm((unsigned int)timeout);
	if (s && s->init)
		s->init();
	if (t->init)
		t->init();
	t->fn();
	if (t->fini)
		t->fini();
	if (s && s->fini)
		s->fini();
	fflush(NULL);
	_exit(atomic_load(&failed) ? 1 : 0);
}

/* Criterion's --list, as its --ascii form prints it: tests/check-ids.sh
 * reads it to check the ids that tests/meson.build filters by. */
static void list(const struct runner_test *ordered)
{
	for (const struct runner_test *t = ordered; t != NULL; t = t->next) {
		const struct runner_test *u = ordered;
		while (strcmp(u->suite, t->suite) != 0)
			u = u->next;
		if (u != t)
			continue; /* listed under its suite's first test */
		int n = 0;
		for (u = t; u != NULL; u = u->next)
			n += strcmp(u->suite, t->suite) == 0;
		printf("%s: %d test%s\n", t->suite, n, n == 1 ? "" : "s");
		for (u = t; u != NULL; u = u->next)
			if (strcmp(u->suite, t->suite) == 0)
				printf("%s-- %s\n", --n > 0 ? "|" : "`",
				       u->name);
	}
}

int main(int argc, char **argv)
{
	/* Criterion's --filter PATTERN (or --filter=PATTERN): a shell
	 * pattern, extended as in ksh, over "suite/name". */
	const char *filter = NULL;
	bool listing = false;
	if (argc == 3 && strcmp(argv[1], "--filter") == 0)
		filter = argv[2];
	else if (argc == 2 && strncmp(argv[1], "--filter=", 9) == 0)
		filter = argv[1] + 9;
	else if (argc == 2 &&
		 (strcmp(argv[1], "--list") == 0 || strcmp(argv[1], "-l") == 0))
		listing = true;
	else if (argc != 1) {
		fprintf(stderr, "usage: %s [--filter PATTERN | --list]\n",
			argv[0]);
		return 2;
	}
	int passed = 0, failures = 0;

	/* Constructors registered the tests in reverse; run them in order. */
	struct runner_test *ordered = NULL;
	while (tests != NULL) {
		struct runner_test *t = tests;
		tests = t->next;
		t->next = ordered;
		ordered = t;
	}
	if (listing) {
		list(ordered);
		return 0;
	}
	for (struct runner_test *t = ordered; t != NULL; t = t->next) {
		char id[256], path[256];
		snprintf(id, sizeof id, "%s::%s", t->suite, t->name);
		snprintf(path, sizeof path, "%s/%s", t->suite, t->name);
		if (filter != NULL && fnmatch(filter, path, FNM_EXTMATCH) != 0)
			continue;
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0) {
			perror("fork");
			return 2;
		}
		if (pid == 0)
			run_child(t, suite_of(t));
		int status;
		waitpid(pid, &status, 0);
		if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
			passed++;
			printf("[PASS] %s\n", id);
		} else {
			failures++;
			if (WIFSIGNALED(status))
				printf("[CRASH] %s: signal %d%s\n", id,
				       WTERMSIG(status),
				       WTERMSIG(status) == SIGALRM
					       ? " (timeout)"
					       : "");
			else
				printf("[FAIL] %s: exit %d\n", id,
				       WEXITSTATUS(status));
		}
	}
	printf("tsan: %d passed, %d failed\n", passed, failures);
	return failures == 0 ? 0 : 1;
}
