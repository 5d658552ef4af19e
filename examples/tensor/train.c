/* What the example trainers share besides the tensor layer (train.h). */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ----------------------------------------------------------- randomness */

uint64_t next_random(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

static double uniform01(uint64_t *state) /* in (0, 1) */
{
	return ((double)(next_random(state) >> 11) + 0.5) / 9007199254740992.0;
}

double normal(uint64_t *state)
{
	double u = uniform01(state), v = uniform01(state);
	return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

void shuffle(int *order, int n, uint64_t seed, int epoch)
{
	uint64_t state = seed * 1000003u + (uint64_t)epoch + 1;
	for (int i = 0; i < n; i++)
		order[i] = i;
	for (int i = n - 1; i > 0; i--) {
		int j = (int)(next_random(&state) % (uint64_t)(i + 1));
		int t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
}

/* ---------------------------------------------------- options, batches */

double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int parse_threads(const char *list, int *threads, int max)
{
	const char *p = list;
	int n = 0;
	while (*p != '\0') {
		char *end;
		long t = strtol(p, &end, 10);
		if (end == p || t < 1 || t > 1024 || n == max ||
		    (*end != ',' && *end != '\0'))
			return -1;
		threads[n++] = (int)t;
		p = *end == ',' ? end + 1 : end;
	}
	return n > 0 ? n : -1;
}

int parse_mode(const char *name, enum train_mode *mode)
{
	if (strcmp(name, "hogwild") == 0)
		*mode = MODE_HOGWILD;
	else if (strcmp(name, "sync") == 0)
		*mode = MODE_SYNC;
	else
		return -1;
	return 0;
}

const char *mode_name(enum train_mode mode)
{
	return mode == MODE_SYNC ? "sync" : "hogwild";
}

void batch_share(int rows, int part, int parts, int *first, int *n)
{
	/* Boundaries at rows * part / parts: shares differ by one row at
	 * most, and the first ones are the shorter. */
	int begin = (int)((long long)rows * part / parts);
	int end = (int)((long long)rows * (part + 1) / parts);
	*first = begin;
	*n = end - begin;
}

float learning_rate(double lr, int epochs, int epoch)
{
	return (float)(lr * (epochs - epoch) / epochs);
}

uint64_t hash_floats(uint64_t hash, const float *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t bits;
		memcpy(&bits, &v[i], sizeof bits);
		for (int b = 0; b < 4; b++) {
			hash ^= (bits >> (8 * b)) & 0xffu;
			hash *= UINT64_C(0x100000001b3);
		}
	}
	return hash;
}

/* ----------------------------------------------------------- rendezvous */

int rendezvous_init(struct rendezvous *meet)
{
	memset(meet, 0, sizeof *meet);
	int rc = pthread_mutex_init(&meet->lock, NULL);
	if (rc != 0)
		return rc;
	rc = pthread_cond_init(&meet->opened, NULL);
	if (rc != 0)
		goto out_lock;
	rc = pthread_cond_init(&meet->finished, NULL);
	if (rc != 0)
		goto out_opened;
	return 0;
out_opened:
	pthread_cond_destroy(&meet->opened);
out_lock:
	pthread_mutex_destroy(&meet->lock);
	return rc;
}

void rendezvous_destroy(struct rendezvous *meet)
{
	pthread_cond_destroy(&meet->finished);
	pthread_cond_destroy(&meet->opened);
	pthread_mutex_destroy(&meet->lock);
}

int rendezvous_wait(struct rendezvous *meet, unsigned *seen)
{
	pthread_mutex_lock(&meet->lock);
	while (meet->epoch == *seen && !meet->quit)
		pthread_cond_wait(&meet->opened, &meet->lock);
	int quit = meet->quit;
	*seen = meet->epoch;
	pthread_mutex_unlock(&meet->lock);
	return !quit;
}

void rendezvous_done(struct rendezvous *meet)
{
	pthread_mutex_lock(&meet->lock);
	if (--meet->running == 0)
		pthread_cond_signal(&meet->finished);
	pthread_mutex_unlock(&meet->lock);
}

void rendezvous_run(struct rendezvous *meet, unsigned n)
{
	pthread_mutex_lock(&meet->lock);
	meet->running = n;
	meet->epoch++;
	pthread_cond_broadcast(&meet->opened);
	while (meet->running > 0)
		pthread_cond_wait(&meet->finished, &meet->lock);
	pthread_mutex_unlock(&meet->lock);
}

void rendezvous_quit(struct rendezvous *meet)
{
	pthread_mutex_lock(&meet->lock);
	meet->quit = 1;
	pthread_cond_broadcast(&meet->opened);
	pthread_mutex_unlock(&meet->lock);
}
