/* SPDX-License-Identifier: MIT */
/*
 * main.c - percpuref-bench: the command line, the workload registry and the
 * measurement schedule.
 *
 *   percpuref-bench <workload> [--threads LIST] [--variants LIST]
 *                   [--duration S] [--repeat N] [--stat median|best]
 *                   [--baseline N] [--versus VARIANT] [--oversubscribe] [--processes]
 *                   [--hang-limit S]
 *                   [--json FILE|-] [--dry-run] [--list] [workload options]
 *   percpuref-bench --help | --list | --topology | --version
 *
 * Workloads register themselves (PERCPUREF_BENCH_WORKLOAD() in bench.h) by
 * putting a pointer in the linker section percpuref_bench_workloads; this
 * file walks it through __start_/__stop_ symbols, declared weak so a build
 * with no workload still links.
 *
 * Schedule: repetition by repetition, every thread count, every variant,
 * so slow drifts of the machine (other load, thermal) spread over all
 * points instead of landing on one variant.  The reported figure of a point
 * is the median (default) or the best of its repetitions' throughputs.
 * Scaling efficiency needs the baseline row's throughput of each variant
 * (one thread, or --baseline N: the reports' first full L3 domain), so
 * that row is added when --threads leaves it out.  --versus pairs each
 * variant with a reference variant repetition by repetition: the two were
 * measured in the same sweep of their row, seconds apart, so their ratio
 * keeps less of the machine's drift than the ratio of two medians does.
 *
 * Rows: --threads, else the workload's own default list (counted in its
 * groups, so signal1's "1,2,4" means 1, 2 and 4 containers whatever
 * --workers is), else 1,2,4,...,max.  Everything the user gives is checked
 * before the first measurement, the workload's options by its validate()
 * hook included, so a mistake costs a usage message, not a run.
 *
 * Exit status: 0, 1 on a runtime failure, 2 on a usage error (message and
 * usage on stderr).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <percpuref/percpu_ref.h>

#include "harness.h"

extern const struct bench_workload *const __start_percpuref_bench_workloads[]
	__attribute__((weak));
extern const struct bench_workload *const __stop_percpuref_bench_workloads[]
	__attribute__((weak));

static const struct bench_workload **workloads;
static unsigned int nworkloads;

static unsigned int group_size(const struct bench_workload *w)
{
	return w->group_size ? (unsigned int)*w->group_size : 1;
}

static int cmp_workload(const void *a, const void *b)
{
	return strcmp((*(const struct bench_workload *const *)a)->name,
		      (*(const struct bench_workload *const *)b)->name);
}

static void load_workloads(void)
{
	const struct bench_workload *const *p;

	nworkloads = __stop_percpuref_bench_workloads - __start_percpuref_bench_workloads;
	workloads = calloc(nworkloads + 1, sizeof(*workloads));
	if (!workloads)
		bench_die("out of memory");
	for (p = __start_percpuref_bench_workloads; p < __stop_percpuref_bench_workloads; p++) {
		const struct bench_workload *w = *p;

		if (!w->name || !w->help || !w->op || !w->variants || !w->variants[0].name)
			bench_die("workload %s: name, help, op and a variant are required",
				  w->name ? w->name : "(unnamed)");
		if (w->group_size && !w->group)
			bench_die("workload %s: a group_size needs a group name", w->name);
		for (const struct bench_variant *v = w->variants; v->name; v++)
			if (!v->loop)
				bench_die("workload %s, variant %s: no loop", w->name, v->name);
		workloads[p - __start_percpuref_bench_workloads] = w;
	}
	qsort(workloads, nworkloads, sizeof(*workloads), cmp_workload);
}

static const struct bench_workload *find_workload(const char *name)
{
	for (unsigned int i = 0; i < nworkloads; i++)
		if (!strcmp(workloads[i]->name, name))
			return workloads[i];
	return NULL;
}

enum {
	OPT_THREADS = 1000,
	OPT_VARIANTS,
	OPT_DURATION,
	OPT_REPEAT,
	OPT_STAT,
	OPT_OVERSUBSCRIBE,
	OPT_PROCESSES,
	OPT_HANG_LIMIT,
	OPT_BASELINE,
	OPT_VERSUS,
	OPT_JSON,
	OPT_LIBRARY_CPUS,
	OPT_DRY_RUN,
	OPT_LIST,
	OPT_HELP,
	OPT_WORKLOAD,	/* + index of the workload's option */
};

static const struct option common_options[] = {
	{ "threads", required_argument, NULL, OPT_THREADS },
	{ "variants", required_argument, NULL, OPT_VARIANTS },
	{ "duration", required_argument, NULL, OPT_DURATION },
	{ "repeat", required_argument, NULL, OPT_REPEAT },
	{ "stat", required_argument, NULL, OPT_STAT },
	{ "oversubscribe", no_argument, NULL, OPT_OVERSUBSCRIBE },
	{ "processes", no_argument, NULL, OPT_PROCESSES },
	{ "hang-limit", required_argument, NULL, OPT_HANG_LIMIT },
	{ "baseline", required_argument, NULL, OPT_BASELINE },
	{ "versus", required_argument, NULL, OPT_VERSUS },
	{ "json", required_argument, NULL, OPT_JSON },
	{ "library-cpus", required_argument, NULL, OPT_LIBRARY_CPUS },
	{ "dry-run", no_argument, NULL, OPT_DRY_RUN },
	{ "list", no_argument, NULL, OPT_LIST },
	{ "help", no_argument, NULL, OPT_HELP },
};
#define NCOMMON (sizeof(common_options) / sizeof(common_options[0]))

/*
 * The options of the workload on the command line (defaults_of) as they
 * were before it set any: the defaults that usage shows.  Its usage error
 * showed the values given ("signal1 --workers 0" listed "(default 0)"
 * under the message refusing it).
 */
union option_value {
	long l;
	double d;
	const char *s;
	bool b;
};
static const struct bench_workload *defaults_of;
static union option_value *defaults;

/* @o's default, which @value points to. */
static void print_option_value(FILE *out, const struct bench_option *o, const void *value)
{
	switch (o->type) {
	case BENCH_OPT_LONG:
		fprintf(out, " (default %ld)", *(const long *)value);
		break;
	case BENCH_OPT_DOUBLE:
		fprintf(out, " (default %g)", *(const double *)value);
		break;
	case BENCH_OPT_STRING:
		fprintf(out, " (default \"%s\")", *(const char *const *)value);
		break;
	case BENCH_OPT_BOOL:
		break;
	}
}

static void list_workload(FILE *out, const struct bench_workload *w)
{
	fprintf(out, "%s: %s\n", w->name, w->help);
	if (w->threads)
		fprintf(out, "default rows: %s %ss%s\n", w->threads, w->group ? w->group : "thread",
			w->oversubscribe ? ", past the usable CPUs by design" : "");
	fprintf(out, "variants:\n");
	for (const struct bench_variant *v = w->variants; v->name; v++)
		fprintf(out, "  %-16s %s\n", v->name, v->help ? v->help : "");
	if (w->options && w->options[0].name) {
		fprintf(out, "options:\n");
		for (const struct bench_option *o = w->options; o->name; o++) {
			char flag[64];

			snprintf(flag, sizeof(flag), "--%s%s", o->name,
				 o->type == BENCH_OPT_BOOL ? "" :
				 o->type == BENCH_OPT_STRING ? " STR" : " N");
			fprintf(out, "  %-22s %s", flag, o->help ? o->help : "");
			print_option_value(out, o, w == defaults_of ? (const void *)&defaults[o - w->options]
								    : o->value);
			fputc('\n', out);
		}
	}
}

/* Dies (status 1) unless @f, named @name, took everything written to
 * it: a closed pipe or a full disk lost the results (or the listing). */
static void check_written(FILE *f, const char *name)
{
	if (fflush(f) || ferror(f))
		bench_die("%s: cannot write the results", name);
}

/* 0, once standard output took everything. */
static int finish_stdout(void)
{
	check_written(stdout, "standard output");
	return 0;
}

static void usage(FILE *out, const struct bench_workload *w)
{
	fprintf(out,
		"usage: percpuref-bench <workload> [options] [workload options]\n"
		"       percpuref-bench --help | --list | --topology | --version\n"
		"options:\n"
		"  --threads LIST      thread counts: numbers, ranges a-b and \"max\", comma-separated\n"
		"                      (default: the workload's, or 1,2,4,...,max); one thread per\n"
		"                      usable CPU\n"
		"  --variants LIST     variants to run, comma-separated (default: all)\n"
		"  --duration S        seconds measured per point, 0.001..3600, after S/5 of warm-up\n"
		"                      (default 0.5)\n"
		"  --repeat N          measure every point N times, 1..1000, interleaved (default 1)\n"
		"  --stat median|best  which repetition to report (default median)\n"
		"  --oversubscribe     allow more threads than usable CPUs (rows flagged '!'); implied\n"
		"                      for workloads that oversubscribe by design\n"
		"  --processes         run each row of T threads as T one-thread processes at once,\n"
		"                      pinned as the threads would be: the machine's own scaling,\n"
		"                      nothing shared (throughput only; not for signal1, fence-cost)\n"
		"  --hang-limit S      fail the run (exit 1) when a point's thread has not returned,\n"
		"                      or a --processes child not ended, S seconds past its window\n"
		"                      (0.01..86400, default 60)\n"
		"  --baseline N        efficiency relative to the N-thread row (1..65536), as the\n"
		"                      reports' 8C16T = 100%%:\n"
		"                      (throughput(T) / T) / (throughput(N) / N) (default 1);\n"
		"                      domain: N = the first L3 domain's CPUs where there are\n"
		"                      several domains, else 1\n"
		"  --versus VARIANT    also report each variant's throughput over VARIANT's in the\n"
		"                      same row and repetition (one sweep of the row): the\n"
		"                      median, lowest and highest over the repetitions\n"
		"  --json FILE         also write JSON Lines to FILE; \"-\": JSON on stdout, table on stderr\n"
		"  --library-cpus LIST CPUs the library's threads (callback thread, reclaimer) run on\n"
		"                      (\"0-3,8\"; default: $PERCPUREF_LIBRARY_CPUS, else where the\n"
		"                      thread whose call starts them may run)\n"
		"  --dry-run           check everything given and print the plan, measure nothing\n"
		"  --list              list workloads, or the workload's variants and options\n"
		"  --topology          (no workload) print the usable CPUs in placement order,\n"
		"                      the per-CPU fast path this process uses and its fences\n"
		"  --version           print the version and the fast path this process uses\n");
	if (w) {
		fputc('\n', out);
		list_workload(out, w);
		return;
	}
	fprintf(out, "workloads:\n");
	for (unsigned int i = 0; i < nworkloads; i++)
		fprintf(out, "  %-16s %s\n", workloads[i]->name, workloads[i]->help);
}

static void __attribute__((noreturn, format(printf, 2, 3)))
usage_error(const struct bench_workload *w, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "percpuref-bench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	usage(stderr, w);
	exit(2);
}

/* --help, --list, --topology, --version (@opt) stand alone: @argc counts
 * the program's, or the workload's, arguments from the name on. */
static void stands_alone(const struct bench_workload *w, int argc, const char *opt)
{
	if (argc != 2)
		usage_error(w, "%s takes no other argument", opt);
}

/*
 * Reads the decimal number at the start of @s into *@out and points *@end
 * past it; false if @s does not start with a digit or the number does not
 * fit.  strtoul() alone skips blanks and takes a sign, turning "-1" into
 * ULONG_MAX and "-18446744073709551615" into 1, so a range check after it
 * can pass a number the user never wrote.
 */
static bool parse_decimal(const char *s, char **end, unsigned long *out)
{
	if (!isdigit((unsigned char)*s))
		return false;
	errno = 0;
	*out = strtoul(s, end, 10);
	return !errno;
}

/*
 * @arg, all of it, as a decimal real number ("-1.5", ".5", "2e3") into
 * *@out; false for anything strtod() alone would also take: blanks, a plus
 * sign, hexadecimal ("0x1p4"), "inf", "nan", or one that does not fit.
 */
static bool parse_real(const char *arg, double *out)
{
	const char *digits = arg + (*arg == '-');
	char *end;

	if (!isdigit((unsigned char)*digits) && *digits != '.')
		return false;
	if (strpbrk(digits, "xX"))
		return false;
	errno = 0;
	*out = strtod(arg, &end);
	return end != arg && !*end && !errno && isfinite(*out);
}

/* @arg, all of it, as a number in @min..@max into *@out, which a failure leaves alone. */
static bool parse_uint(const char *arg, unsigned int min, unsigned int max, unsigned int *out)
{
	unsigned long v;
	char *end;

	if (!parse_decimal(arg, &end, &v) || *end || v < min || v > max)
		return false;
	*out = v;
	return true;
}

/*
 * Parses "1,2,8-12,max" into @out (sorted, unique); returns the count.
 * @what names the list in messages.  The counts are marked in a set, not
 * listed as given: 16000 copies of "1-65536" (128 KB) were 2^30 entries,
 * 4 GiB and minutes of sorting before their duplicates went.
 */
static unsigned int parse_threads(const struct bench_workload *w, const char *what,
				  const char *arg, unsigned int max, unsigned int **out)
{
	unsigned int n = 0, *list;
	bool *given = calloc(BENCH_MAX_THREADS + 1, sizeof(*given));
	char *copy = strdup(arg), *rest = copy, *tok;

	if (!given || !copy)
		bench_die("out of memory");
	/* strsep(), not strtok_r(): "1,,2" and "1," have an empty element to refuse. */
	while ((tok = strsep(&rest, ","))) {
		unsigned long lo, hi;
		char *end;

		if (!*tok)
			usage_error(w, "%s: empty element in \"%s\"", what, arg);
		if (!strcmp(tok, "max")) {
			lo = hi = max;
		} else {
			bool ok = parse_decimal(tok, &end, &lo);

			hi = lo;
			if (ok && *end == '-')
				ok = parse_decimal(end + 1, &end, &hi);
			if (!ok || *end || lo == 0 || hi < lo || hi > BENCH_MAX_THREADS)
				usage_error(w, "%s: bad element \"%s\"", what, tok);
		}
		for (unsigned long t = lo; t <= hi; t++) {
			n += !given[t];
			given[t] = true;
		}
	}
	free(copy);
	list = malloc(n * sizeof(*list));
	if (!list)
		bench_die("out of memory");
	n = 0;
	for (unsigned int t = 1; t <= BENCH_MAX_THREADS; t++)
		if (given[t])
			list[n++] = t;
	free(given);
	*out = list;
	return n;
}

static unsigned int default_threads(unsigned int max, unsigned int **out)
{
	unsigned int n = 0, *list = malloc(34 * sizeof(*list));

	if (!list)
		bench_die("out of memory");
	for (unsigned int t = 1; t < max; t *= 2)
		list[n++] = t;
	list[n++] = max;
	*out = list;
	return n;
}

/* Parses "a,b" into variants of @w, in the order given. */
static unsigned int parse_variants(const struct bench_workload *w, const char *arg,
				   const struct bench_variant ***out)
{
	unsigned int n = 0, cap = 0;
	const struct bench_variant **list;
	char *copy = strdup(arg), *save = NULL;

	for (const struct bench_variant *v = w->variants; v->name; v++)
		cap++;
	/* Stored first, so a usage error's exit leaks nothing (LeakSanitizer). */
	*out = list = calloc(cap, sizeof(*list));
	if (!list || !copy)
		bench_die("out of memory");
	/* strtok_r() would skip an empty name, as --threads does not. */
	if (arg[0] == ',' || strstr(arg, ",,") || (arg[0] && arg[strlen(arg) - 1] == ','))
		usage_error(w, "--variants: empty name in \"%s\"", arg);
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		const struct bench_variant *v = w->variants;

		while (v->name && strcmp(v->name, tok))
			v++;
		if (!v->name)
			usage_error(w, "workload %s has no variant \"%s\"", w->name, tok);
		for (unsigned int i = 0; i < n; i++)
			if (list[i] == v)
				usage_error(w, "--variants: \"%s\" given twice", tok);
		list[n++] = v;
	}
	free(copy);
	if (n == 0)
		usage_error(w, "--variants: empty list");
	return n;
}

static void parse_workload_option(const struct bench_workload *w, const struct bench_option *o,
				  const char *arg)
{
	long l = 0;
	double d = 0;
	char *end = (char *)arg;
	bool ok = false;

	switch (o->type) {
	case BENCH_OPT_LONG:
		/* Decimal only: base 0 would read "010" as 8 and take "0x10". */
		errno = 0;
		if (isdigit((unsigned char)arg[*arg == '-']))
			l = strtol(arg, &end, 10);
		ok = end != arg && !*end && !errno;
		break;
	case BENCH_OPT_DOUBLE:
		ok = parse_real(arg, &d);
		break;
	case BENCH_OPT_STRING:
		*(const char **)o->value = arg;
		return;
	case BENCH_OPT_BOOL:
		*(bool *)o->value = true;
		return;
	}
	if (!ok)
		usage_error(w, "--%s: bad number \"%s\"", o->name, arg);
	if (o->type == BENCH_OPT_LONG)
		*(long *)o->value = l;
	else
		*(double *)o->value = d;
}

static double rate(const struct sample *s)
{
	return s->seconds > 0 ? s->ops / s->seconds : 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The median of @n sorted numbers. */
static double median_of_sorted(const double *x, unsigned int n)
{
	return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

/* The reported throughput of @res over its @repeat samples. */
static double aggregate(const struct result *res, unsigned int repeat, bool best)
{
	double rates[repeat];

	for (unsigned int k = 0; k < repeat; k++)
		rates[k] = rate(&res->samples[k]);
	qsort(rates, repeat, sizeof(*rates), cmp_double);
	if (best)
		return rates[repeat - 1];
	return median_of_sorted(rates, repeat);
}

/*
 * --versus: @res's throughput over @ref's (the reference variant's point
 * in the same row), repetition by repetition, where both completed
 * operations; their median, lowest and highest.
 */
static void pair_with(struct result *res, const struct result *ref, unsigned int repeat)
{
	double ratios[repeat];
	unsigned int n = 0;

	for (unsigned int k = 0; k < repeat; k++)
		if (rate(&res->samples[k]) > 0 && rate(&ref->samples[k]) > 0)
			ratios[n++] = rate(&res->samples[k]) / rate(&ref->samples[k]);
	res->versus_rounds = n;
	res->versus_median = res->versus_low = res->versus_high = NAN;
	if (!n)
		return;
	qsort(ratios, n, sizeof(*ratios), cmp_double);
	res->versus_median = median_of_sorted(ratios, n);
	res->versus_low = ratios[0];
	res->versus_high = ratios[n - 1];
}

/* The value of option @name, seconds in [@min, @max]; else a usage error. */
static double seconds_option(const struct bench_workload *w, const char *name, const char *arg,
			     double min, double max)
{
	double v;

	if (!parse_real(arg, &v) || !(v >= min) || v > max)
		usage_error(w, "%s: want seconds in [%g, %g], got \"%s\"", name, min, max, arg);
	return v;
}

/* What the command line asked for, beyond the report's own fields. */
struct cli {
	const char *threads;
	const char *variants;
	const char *json;
	const char *library_cpus;
	const char *versus;	/* --versus, or NULL */
	unsigned int baseline;	/* 0: not given (one thread) */
	bool baseline_domain;	/* --baseline domain */
	bool oversubscribe;
	bool dry_run;
	bool list;
};

/* Parses the arguments after the workload's name; exits on --help. */
static void parse_cli(const struct bench_workload *w, int argc, char **argv, struct cli *cli,
		      struct report *r)
{
	unsigned int nopts = 0;
	struct option *longopts;
	bool *given;
	const char *why;
	int c, index;

	for (const struct bench_option *o = w->options; o && o->name; o++)
		nopts++;
	longopts = calloc(NCOMMON + nopts + 1, sizeof(*longopts));
	/* By option code - OPT_THREADS: a flag given twice is refused (the
	 * last one won, silently: "--json a --json b" never wrote a). */
	given = calloc(NCOMMON + nopts, sizeof(*given));
	defaults = calloc(nopts + 1, sizeof(*defaults));
	if (!longopts || !given || !defaults)
		bench_die("out of memory");
	for (unsigned int i = 0; i < nopts; i++) {
		const struct bench_option *o = &w->options[i];

		switch (o->type) {
		case BENCH_OPT_LONG:
			defaults[i].l = *(long *)o->value;
			break;
		case BENCH_OPT_DOUBLE:
			defaults[i].d = *(double *)o->value;
			break;
		case BENCH_OPT_STRING:
			defaults[i].s = *(const char **)o->value;
			break;
		case BENCH_OPT_BOOL:
			defaults[i].b = *(bool *)o->value;
			break;
		}
	}
	defaults_of = w;
	memcpy(longopts, common_options, sizeof(common_options));
	for (unsigned int i = 0; i < nopts; i++) {
		const struct bench_option *o = &w->options[i];

		for (unsigned int k = 0; k < NCOMMON + i; k++)
			if (!strcmp(longopts[k].name, o->name))
				bench_die("workload %s: option --%s defined twice", w->name, o->name);
		longopts[NCOMMON + i] = (struct option){
			o->name, o->type == BENCH_OPT_BOOL ? no_argument : required_argument,
			NULL, OPT_WORKLOAD + (int)i
		};
	}

	/* -h: --help, as before a workload (getopt_long is given no short
	 * option: "micro -h" was an unknown option). */
	if (argc > 1 && !strcmp(argv[1], "-h")) {
		stands_alone(w, argc, argv[1]);
		usage(stdout, w);
		exit(finish_stdout());
	}
	/* ":" first: report errors ourselves, ':' for a missing value. */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":", longopts, &index)) != -1) {
		if (c >= OPT_THREADS) {
			if (given[c - OPT_THREADS])
				usage_error(w, "--%s given twice", longopts[index].name);
			given[c - OPT_THREADS] = true;
		}
		switch (c) {
		case OPT_THREADS:
			cli->threads = optarg;
			break;
		case OPT_VARIANTS:
			cli->variants = optarg;
			break;
		case OPT_DURATION:
			/* A millisecond at least: a shorter point measures the clock. */
			r->duration = seconds_option(w, "--duration", optarg, 0.001, 3600);
			break;
		case OPT_REPEAT:
			if (!parse_uint(optarg, 1, 1000, &r->repeat))
				usage_error(w, "--repeat: want 1..1000, got \"%s\"", optarg);
			break;
		case OPT_STAT:
			if (strcmp(optarg, "median") && strcmp(optarg, "best"))
				usage_error(w, "--stat: want median or best, got \"%s\"", optarg);
			r->stat = optarg;
			break;
		case OPT_OVERSUBSCRIBE:
			cli->oversubscribe = true;
			break;
		case OPT_PROCESSES:
			/* A process per group member would split what the
			 * workload's groups share by design. */
			if (w->group)
				usage_error(w, "--processes: workload %s runs its threads in %ss",
					    w->name, w->group);
			if (w->roles)
				usage_error(w, "--processes: workload %s gives thread 0 a part of "
					    "its own", w->name);
#if defined(__SANITIZE_THREAD__)
			usage_error(w, "--processes: not in a ThreadSanitizer build, which "
				    "cannot run threads in a fork child");
#endif
			r->processes = true;
			break;
		case OPT_HANG_LIMIT:
			r->hang_limit = seconds_option(w, "--hang-limit", optarg, 0.01, 86400);
			break;
		case OPT_BASELINE:
			cli->baseline_domain = !strcmp(optarg, "domain");
			if (!cli->baseline_domain &&
			    !parse_uint(optarg, 1, BENCH_MAX_THREADS, &cli->baseline))
				usage_error(w, "--baseline: want a thread count 1..65536 or domain, "
					    "got \"%s\"", optarg);
			if (w->no_efficiency)
				usage_error(w, "--baseline: workload %s has no efficiency", w->name);
			break;
		case OPT_VERSUS:
			cli->versus = optarg;
			break;
		case OPT_JSON:
			if (!*optarg)
				usage_error(w, "--json: empty file name");
			cli->json = optarg;
			break;
		case OPT_LIBRARY_CPUS:
			cli->library_cpus = optarg;
			break;
		case OPT_DRY_RUN:
			cli->dry_run = true;
			break;
		case OPT_LIST:
		case OPT_HELP:
			stands_alone(w, argc, argv[optind - 1]);
			if (c == OPT_LIST) {
				cli->list = true;
				break;
			}
			usage(stdout, w);
			exit(finish_stdout());
		case ':':
			usage_error(w, "%s needs a value", argv[optind - 1]);
		case '?':
			/* A short option inside a cluster ("-xyz"): optind has
			 * not moved past it, optopt names it.  A long option
			 * given a value it takes none of ("--help=x"): optopt
			 * is its OPT_ code. */
			if (optopt >= OPT_THREADS)
				usage_error(w, "%s takes no value", argv[optind - 1]);
			if (optopt)
				usage_error(w, "unknown option -%c", optopt);
			/* getopt_long takes unambiguous prefixes ("--dur"). */
			usage_error(w, "unknown or ambiguous option %s", argv[optind - 1]);
		default:
			parse_workload_option(w, &w->options[c - OPT_WORKLOAD], optarg);
			break;
		}
	}
	if (optind < argc)
		usage_error(w, "unexpected argument \"%s\"", argv[optind]);
	free(longopts);
	free(given);
	if (w->validate && (why = w->validate()))
		usage_error(w, "%s: %s", w->name, why);
	if (w->group_size && (*w->group_size < 1 || *w->group_size > BENCH_MAX_THREADS))
		bench_die("workload %s: %s size %ld; its validate() must keep it in 1..65536",
			  w->name, w->group, *w->group_size);
}

/*
 * --baseline domain: the reports' 100% is their first full L3 domain
 * (8C16T); with a single domain no row crosses one, so one thread.
 */
static unsigned int first_domain_threads(const struct topology *topo)
{
	unsigned int n = 0;

	if (topo->ndomains < 2)
		return 1;
	while (n < topo->ncpus && topo->domain[n] == topo->domain[0])
		n++;
	return n;
}

/* Rows and columns of @r from the command line. */
static void plan_report(struct report *r, const struct cli *cli)
{
	const struct bench_workload *w = r->workload;
	bool oversubscribe = cli->oversubscribe || w->oversubscribe;
	unsigned int *threads;
	const char *why;

	if (cli->threads) {
		r->nthreads = parse_threads(w, "--threads", cli->threads, r->topo->ncpus,
					    &threads);
	} else if (w->threads) {
		unsigned int size = group_size(w), ncpus = r->topo->ncpus;

		/* Counted in groups: "max" is the groups that fill the CPUs. */
		r->nthreads = parse_threads(w, "the workload's default rows", w->threads,
					    ncpus > size ? ncpus / size : 1, &threads);
		for (unsigned int i = 0; i < r->nthreads; i++) {
			if ((uint64_t)threads[i] * size > BENCH_MAX_THREADS)
				usage_error(w, "%u %ss of %u threads: more than 65536 threads",
					    threads[i], w->group, size);
			threads[i] *= size;
		}
	} else {
		r->nthreads = default_threads(r->topo->ncpus, &threads);
	}
	r->baseline = cli->baseline_domain ? first_domain_threads(r->topo)
		      : cli->baseline ? cli->baseline : 1;
	/* Efficiency divides by the baseline row: add it where it is missing. */
	if (!w->no_efficiency) {
		unsigned int at = 0;

		while (at < r->nthreads && threads[at] < r->baseline)
			at++;
		if (at == r->nthreads || threads[at] != r->baseline) {
			if (!oversubscribe && r->baseline > r->topo->ncpus)
				usage_error(w, "--baseline %u: only %u CPUs usable; --oversubscribe "
					    "allows more", r->baseline, r->topo->ncpus);
			threads = realloc(threads, (r->nthreads + 1) * sizeof(*threads));
			if (!threads)
				bench_die("out of memory");
			memmove(threads + at + 1, threads + at,
				(r->nthreads++ - at) * sizeof(*threads));
			threads[at] = r->baseline;
		}
		r->baseline_row = at;
	}
	if (!oversubscribe && threads[r->nthreads - 1] > r->topo->ncpus)
		usage_error(w, "--threads %u: only %u CPUs usable; --oversubscribe allows more",
			    threads[r->nthreads - 1], r->topo->ncpus);
	r->threads = threads;
	if (w->validate_rows && (why = w->validate_rows(threads[r->nthreads - 1])))
		usage_error(w, "%s: %s", w->name, why);

	if (cli->variants) {
		r->nvariants = parse_variants(w, cli->variants, &r->variants);
	} else {
		const struct bench_variant **all;

		for (const struct bench_variant *v = w->variants; v->name; v++)
			r->nvariants++;
		all = calloc(r->nvariants, sizeof(*all));
		if (!all)
			bench_die("out of memory");
		for (unsigned int i = 0; i < r->nvariants; i++)
			all[i] = &w->variants[i];
		r->variants = all;
	}
	if (cli->versus) {
		unsigned int v = 0;

		while (v < r->nvariants && strcmp(r->variants[v]->name, cli->versus))
			v++;
		if (v == r->nvariants)
			usage_error(w, "--versus %s: not one of the variants this run measures",
				    cli->versus);
		if (r->nvariants < 2)
			usage_error(w, "--versus %s: no other variant to compare with it",
				    cli->versus);
		r->versus = r->variants[v];
		r->versus_column = v;
	}

	r->results = calloc(r->nthreads * r->nvariants, sizeof(*r->results));
	if (!r->results)
		bench_die("out of memory");
	for (unsigned int i = 0; i < r->nthreads * r->nvariants; i++) {
		r->results[i].variant = r->variants[i % r->nvariants];
		r->results[i].threads = r->threads[i / r->nvariants];
		r->results[i].samples = calloc(r->repeat, sizeof(struct sample));
		if (!r->results[i].samples)
			bench_die("out of memory");
	}
}

/*
 * Every repetition of every point.  A run planned longer than
 * PROGRESS_AFTER_S seconds, with stderr on a terminal, shows a progress
 * line there: point k of N, the elapsed time and an estimate of what is
 * left (the mean time per point so far, times the points left).
 */
#define PROGRESS_AFTER_S 3.0

/* Seconds of the measurement windows of @r's @points, with each window's
 * warm-up, a fifth of it; set-ups not counted. */
static double windows_seconds(const struct report *r, unsigned int points)
{
	return points * r->duration * 1.2;
}

static void run_schedule(struct report *r)
{
	unsigned int points = r->nthreads * r->nvariants, total = r->repeat * points, done = 0;
	bool progress = isatty(STDERR_FILENO) && windows_seconds(r, total) > PROGRESS_AFTER_S;
	double start = bench_seconds();
	struct timespec now;
	struct tm tm;
	size_t len;

	/* To the microsecond: with the host name it tells runs apart, and
	 * two short runs often start within one second. */
	clock_gettime(CLOCK_REALTIME, &now);
	len = strftime(r->started, sizeof(r->started), "%Y-%m-%dT%H:%M:%S",
		       gmtime_r(&now.tv_sec, &tm));
	snprintf(r->started + len, sizeof(r->started) - len, ".%06ldZ", now.tv_nsec / 1000);
	for (unsigned int k = 0; k < r->repeat; k++) {
		for (unsigned int i = 0; i < points; i++) {
			struct result *res = &r->results[i];
			double transfer_ns;

			if (progress) {
				double elapsed = bench_seconds() - start;

				fprintf(stderr, "\r%s: point %u of %u (%s, %u thread%s), %.0f s elapsed",
					r->workload->name, done + 1, total, res->variant->name,
					res->threads, res->threads == 1 ? "" : "s", elapsed);
				if (done)
					fprintf(stderr, ", ~%.0f s left",
						elapsed / done * (total - done));
				fprintf(stderr, "\033[K");
				progress_shown();
			}
			transfer_ns = measure_line_transfer(r->topo);
			res->samples[k] = (r->processes ? measure_processes : measure)(
				r->workload, res->variant, res->threads, r->topo, r->duration,
				r->hang_limit);
			res->samples[k].transfer_ns = transfer_ns;
			done++;
		}
	}
	progress_erase();
}

/* Each metric of @res's samples: its mean over the samples where it is finite. */
static void mean_metrics(struct result *res, unsigned int repeat)
{
	for (unsigned int k = 0; k < repeat; k++) {
		const struct bench_metrics *m = &res->samples[k].metrics;

		for (unsigned int j = 0; j < m->n; j++) {
			double sum = 0;
			unsigned int n = 0;

			for (unsigned int q = 0; q < repeat; q++) {
				const struct bench_metrics *o = &res->samples[q].metrics;

				for (unsigned int p = 0; p < o->n; p++) {
					if (!strcmp(o->v[p].name, m->v[j].name) &&
					    isfinite(o->v[p].value)) {
						sum += o->v[p].value;
						n++;
					}
				}
			}
			metrics_set(&res->metrics, m->v[j].name, n ? sum / n : NAN, m->v[j].unit);
		}
	}
}

static void compute_results(struct report *r)
{
	bool best = !strcmp(r->stat, "best");

	for (unsigned int i = 0; i < r->nthreads * r->nvariants; i++) {
		struct result *res = &r->results[i];

		res->groups = (res->threads + group_size(r->workload) - 1) / group_size(r->workload);
		res->ops_per_sec = aggregate(res, r->repeat, best);
		res->ns_per_op = res->ops_per_sec > 0 ? res->threads * 1e9 / res->ops_per_sec : NAN;
		mean_metrics(res, r->repeat);
	}
	/* A second pass: the baseline's throughput must be known first. */
	for (unsigned int i = 0; i < r->nthreads * r->nvariants; i++) {
		struct result *res = &r->results[i];
		const struct result *base = &r->results[r->baseline_row * r->nvariants +
							 i % r->nvariants];

		if (r->workload->no_efficiency)
			res->efficiency = -1;
		else if (res->ops_per_sec > 0 && base->ops_per_sec > 0)
			res->efficiency = (res->ops_per_sec / res->threads) /
					  (base->ops_per_sec / base->threads);
		else
			res->efficiency = NAN;	/* shown as "-" */
		if (r->versus && i % r->nvariants != r->versus_column)
			pair_with(res, &r->results[i - i % r->nvariants + r->versus_column],
				  r->repeat);
		else
			res->versus_median = res->versus_low = res->versus_high = NAN;
	}
}

/*
 * Says on standard error how many measurements completed no operation in
 * their window: an operation longer than --duration (managed-latency's
 * release waits up to two scan intervals) counts nowhere, and its point's
 * figures would be 0, or biased where other repetitions did count some.
 */
static void warn_empty_samples(const struct report *r)
{
	unsigned int points = r->nthreads * r->nvariants, empty = 0;

	for (unsigned int i = 0; i < points; i++)
		for (unsigned int k = 0; k < r->repeat; k++)
			empty += r->results[i].samples[k].ops == 0;
	if (empty)
		fprintf(stderr, "percpuref-bench: %s: %u of %u measurements completed no %s "
			"in their --duration of %g s (shown as -, or biasing their point): "
			"give a longer --duration\n", r->workload->name, empty,
			points * r->repeat, r->workload->op, r->duration);
}

static void free_report(struct report *r)
{
	for (unsigned int i = 0; i < r->nthreads * r->nvariants; i++) {
		for (unsigned int k = 0; k < r->repeat; k++)
			metrics_free(&r->results[i].samples[k].metrics);
		metrics_free(&r->results[i].metrics);
		free(r->results[i].samples);
	}
	free(r->results);
	free((void *)r->variants);
	free((void *)r->threads);
}

/*
 * True if @path is the file descriptor @fd writes to, a regular file
 * ("--json r.txt >r.txt", "--json /dev/stdout >r.txt"), which opened again
 * for the JSON was truncated, the table written there lost; or a pipe or a
 * socket ("--json /dev/stdout | reader"), down which the table and the JSON
 * went mixed.  The same for standard error ("--json r.txt 2>r.txt"): a
 * line written there after the JSON (a workload's summary at exit) wrote
 * over its start.  A device both write to (a terminal, /dev/null) loses
 * nothing.
 */
static bool is_output_file(const char *path, int fd)
{
	struct stat file, out;

	return !stat(path, &file) &&
	       (S_ISREG(file.st_mode) || S_ISFIFO(file.st_mode) || S_ISSOCK(file.st_mode)) &&
	       !fstat(fd, &out) && file.st_dev == out.st_dev && file.st_ino == out.st_ino;
}

/*
 * The --json file, checked before the run so that a bad path fails before a
 * long run, but truncated only once there are results to write: a regular
 * file is opened for appending now, which changes nothing, and is opened
 * again for writing at the end (NULL).  An interrupted or failed run
 * (Ctrl-C, a thread refused) once left the previous run's file empty.  A
 * new one is created exclusively and removed at once: an interrupted run
 * left it there, empty, and one another process made between a look and a
 * creation was removed too.  Anything else (a pipe, /dev/null, a terminal)
 * is opened for writing now, once: opening it twice could block on a FIFO
 * or show its reader an early end.  @dry_run (--dry-run): the same checks,
 * but such a file is not opened (a directory is refused, another file
 * needs write permission), and nothing is returned.
 */
static FILE *open_json_early(const char *path, bool dry_run)
{
	struct stat st;
	FILE *f;
	int fd;

	if (!stat(path, &st) && !S_ISREG(st.st_mode)) {
		if (dry_run) {
			errno = S_ISDIR(st.st_mode) ? EISDIR : 0;
			if (errno || access(path, W_OK))
				bench_die("%s: %m", path);
			return NULL;
		}
		/* A FIFO with no reader yet: ENXIO, where a blocking open
		 * waited for one, saying nothing. */
		fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0 && errno == ENXIO)
			bench_die("%s: a FIFO with no reader: start its reader first", path);
		if (fd < 0 || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) ||
		    !(f = fdopen(fd, "w")))
			bench_die("%s: %m", path);
		return f;
	}
	/* O_EXCL: only a file this call made is ours to remove (a dangling
	 * symlink is not: EEXIST, and it is checked as an existing file). */
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
	if (fd >= 0) {
		close(fd);
		unlink(path);
		return NULL;
	}
	if (errno != EEXIST)
		bench_die("%s: %m", path);
	f = fopen(path, "a");
	if (!f)
		bench_die("%s: %m", path);
	fclose(f);
	return NULL;
}

/*
 * --dry-run: the rows, columns and points a run would measure, and an
 * estimate of its length, once everything given has been checked as a
 * run checks it, a --json FILE by open_json_early() (a new one is made and
 * removed at once, as a run does before it starts).
 */
static void print_plan(const struct report *r, const struct cli *cli)
{
	unsigned int points = r->nthreads * r->nvariants * r->repeat;

	if (cli->json && strcmp(cli->json, "-"))
		open_json_early(cli->json, true);
	printf("%s: %u thread row%s (", r->workload->name, r->nthreads, r->nthreads == 1 ? "" : "s");
	for (unsigned int i = 0; i < r->nthreads; i++)
		printf("%s%u", i ? "," : "", r->threads[i]);
	printf(") x %u variant%s (", r->nvariants, r->nvariants == 1 ? "" : "s");
	for (unsigned int i = 0; i < r->nvariants; i++)
		printf("%s%s", i ? "," : "", r->variants[i]->name);
	printf(") x %u repetition%s: %u points, %.1f s of windows and warm-ups (set-ups not "
	       "counted)", r->repeat, r->repeat == 1 ? "" : "s", points,
	       windows_seconds(r, points));
	if (r->versus)
		printf("; versus %s", r->versus->name);
	putchar('\n');
}

static void release_nothing(struct percpu_ref *ref)
{
	(void)ref;
}

/* Starts the library's callback thread with a kill, and waits for it. */
static void start_callback_thread(void)
{
	struct percpu_ref ref;

	if (percpu_ref_init(&ref, release_nothing, 0))
		bench_die("percpu_ref_init: out of memory");
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	percpu_ref_exit(&ref);
}

/*
 * The CPUs of the library's threads: --library-cpus, else
 * PERCPUREF_LIBRARY_CPUS, set (again) through the library, so that a list
 * it refuses, or ignored with a warning at its set-up, fails the run
 * instead of measuring another placement than the one asked for.  With a
 * library thread running, so that the library checks the list against the
 * CPUs that thread may use: with none, it can check nothing, and a CPU the
 * machine lacks ("5" on two CPUs) passed, warned only once a thread
 * started, and was named in the table's header (review).
 */
static void place_library_threads(struct report *r, const struct cli *cli)
{
	const char *list = cli->library_cpus, *what = "--library-cpus ";
	int err;

	if (!list) {
		list = getenv("PERCPUREF_LIBRARY_CPUS");
		what = "PERCPUREF_LIBRARY_CPUS=";
		if (!list || !*list)
			return;	/* an empty one counts as unset, as for the library */
	}
	start_callback_thread();
	err = percpuref_set_library_cpus(list);
	if (err == -EINVAL)
		usage_error(r->workload, "%s%s: not a list of CPUs (\"0-3,8\") that the library's "
			    "threads may use", what, list);
	if (err)
		usage_error(r->workload, "%s%s: %s", what, list, strerror(-err));
	r->library_cpus = list;
}

/*
 * A standard stream the caller closed (">&-", "2>&-") gets /dev/null,
 * read-only: the next file opened (the --json file) took its number, and
 * the table or a warning went into that file.  Writes to it now fail, so a
 * closed standard output fails the run as a full one does.
 */
static void hold_closed_streams(void)
{
	for (int fd = STDIN_FILENO; fd <= STDERR_FILENO; fd++)
		/* The lowest free number: this one, the ones below it held. */
		if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDONLY) != fd)
			return;	/* no /dev/null (a bare sandbox): as it was */
}

/* Measures every point of @r and writes the table and the JSON. */
static void measure_and_report(struct report *r, const struct cli *cli)
{
	FILE *table_out = stdout, *json_out = NULL;

	if (cli->json && !strcmp(cli->json, "-")) {
		json_out = stdout;
		table_out = stderr;
	} else if (cli->json) {
		json_out = open_json_early(cli->json, false);
	}

	run_schedule(r);
	compute_results(r);
	warn_empty_samples(r);
	report_table(table_out, r);
	/* With --json -, the table went to standard error. */
	if (table_out != stdout)
		check_written(table_out, "standard error");
	if (cli->json) {
		if (!json_out && !(json_out = fopen(cli->json, "w")))
			bench_die("%s: %m", cli->json);
		report_json(json_out, r);
		/* A full disk or a closed pipe: the results did not get out.
		 * Standard output is checked by the caller. */
		if (json_out != stdout) {
			bool failed = ferror(json_out);

			if (fclose(json_out) || failed)
				bench_die("%s: cannot write the results", cli->json);
		}
	}
}

int main(int argc, char **argv)
{
	struct topology topo;
	struct report r = { .repeat = 1, .stat = "median", .duration = 0.5, .hang_limit = 60,
			    .topo = &topo, .baseline = 1 };
	struct cli cli = { 0 };

	/* Before anything opens a file. */
	hold_closed_streams();
	/* A closed pipe ("| head -1") is a write error, exit 1 with a
	 * message, as documented; SIGPIPE killed the process silently. */
	signal(SIGPIPE, SIG_IGN);
	/* First: the library's set-up may start threads. */
	measure_setup();
	r.fast_path = percpuref_fast_path();
	load_workloads();
	if (argc < 2)
		usage_error(NULL, "no workload given");
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		stands_alone(NULL, argc, argv[1]);
		usage(stdout, NULL);
		return finish_stdout();
	}
	if (!strcmp(argv[1], "--version")) {
		stands_alone(NULL, argc, argv[1]);
		printf("percpuref-bench %s (fast path: %s)\n", PERCPUREF_BENCH_VERSION, r.fast_path);
		return finish_stdout();
	}
	if (!strcmp(argv[1], "--list")) {
		stands_alone(NULL, argc, argv[1]);
		for (unsigned int i = 0; i < nworkloads; i++)
			list_workload(stdout, workloads[i]);
		return finish_stdout();
	}
	if (!strcmp(argv[1], "--topology")) {
		stands_alone(NULL, argc, argv[1]);
		topology_read(&topo);
		report_topology(stdout, &topo);
		topology_free(&topo);
		/* Which per-CPU fast path this process (and so a run) uses,
		 * and how its fences reach it. */
		printf("fast path: %s\nfences: %s\n", percpuref_fast_path(), percpuref_fence_method());
		return finish_stdout();
	}
	r.workload = find_workload(argv[1]);
	if (!r.workload)
		usage_error(NULL, "unknown workload \"%s\"", argv[1]);
	/* getopt_long sees the workload's name as argv[0]. */
	parse_cli(r.workload, argc - 1, argv + 1, &cli, &r);
	if (cli.list) {
		list_workload(stdout, r.workload);
		return finish_stdout();
	}
	if (cli.json && strcmp(cli.json, "-")) {
		if (is_output_file(cli.json, STDOUT_FILENO))
			usage_error(r.workload, "--json %s: the file standard output writes the "
				    "table to; --json - writes the JSON there and the table to "
				    "standard error", cli.json);
		if (is_output_file(cli.json, STDERR_FILENO))
			usage_error(r.workload, "--json %s: the file standard error writes "
				    "warnings to; send them elsewhere", cli.json);
	}

	place_library_threads(&r, &cli);
	topology_read(&topo);
	plan_report(&r, &cli);
	if (cli.dry_run)
		print_plan(&r, &cli);
	else
		measure_and_report(&r, &cli);
	finish_stdout();
	free_report(&r);
	topology_free(&topo);
	free(workloads);
	free(defaults);
	return 0;
}
