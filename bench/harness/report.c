/* SPDX-License-Identifier: MIT */
/*
 * report.c - the human table and the JSON Lines output (docs/bench.md).
 *
 * The table has one row per thread count and, per variant, three columns:
 * ns per operation per thread (threads x elapsed / operations: how long one
 * thread waits for one operation, the figure that grows under contention),
 * aggregate millions of operations per second, and scaling efficiency,
 * throughput(N) / (N x throughput(1)), as a percentage (or, with
 * --baseline B, relative to the B-thread row: (throughput(N) / N) /
 * (throughput(B) / B), the reports' normalisation).  Each row names its
 * CPUs as the reports do, xCyT (x physical cores, y threads), with the
 * L3 domains they span.  The header says which fast path the library's
 * per-CPU operations take in this process (rseq or the fallback).  A workload whose
 * threads come in groups (signal1's containers) gets its group count as the
 * rows' first column, and the throughput of one group in place of ns per
 * operation: its report compares groups, and one thread's time is not one
 * group's when a group has several threads.  The figures a workload
 * attaches to its measurements (bench_report_metric()) follow in a second
 * table, one row per thread count and variant, one column per metric in the
 * order the workload first reported them.  With --versus, a table between
 * the two gives each other variant's throughput over the reference's in
 * the same row, paired repetition by repetition (main.c).  The JSON has one
 * self-contained object per row and variant, machine included, so files from
 * different runs and machines can simply be concatenated.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <percpuref/percpu_ref.h>

#include "harness.h"

extern char **environ;

/*
 * A PERCPUREF_* environment entry: the library's settings
 * (PERCPUREF_NO_MEMBARRIER, the reclaimer's PERCPUREF_SCAN_*, which some
 * workloads override, ...) and the harness's own, named with every run, as
 * the table's "fast path" line does not tell them apart (a fallback run
 * under PERCPUREF_NO_MEMBARRIER=1, whose readers fence, took 3 times as
 * long a pair).
 */
static bool library_setting(const char *entry)
{
	return !strncmp(entry, "PERCPUREF_", 10) && strchr(entry, '=');
}

/*
 * The first library_setting() at or after @e, skipping a name that came
 * earlier (a raw execve can pass one twice): named once, with the value
 * getenv() and so the library read, the first.  NULL at the end.
 */
static char **next_library_setting(char **e)
{
	for (; *e; e++) {
		char **before = environ;
		size_t name_len;

		if (!library_setting(*e))
			continue;
		/* "NAME=" matches that name only. */
		name_len = (size_t)(strchr(*e, '=') - *e) + 1;
		while (before < e && strncmp(*before, *e, name_len))
			before++;
		if (before == e)
			return e;
	}
	return NULL;
}

static void center(FILE *out, const char *s, int width)
{
	int len = (int)strlen(s), left = (width - len) / 2;

	fprintf(out, "%*s%s%*s", left > 0 ? left : 0, "", s,
		width - len - left > 0 ? width - len - left : 0, "");
}

static void print_machine(FILE *out, const struct topology *topo)
{
	fprintf(out, "machine: %s; %u of %u online CPUs usable, ", topo->model, topo->ncpus,
		topo->online);
	if (strcmp(topo->domain_source, "none") == 0)
		fprintf(out, "1 domain (no L3 or package data)");
	else
		fprintf(out, "%u %s domain%s", topo->ndomains, topo->domain_source,
			topo->ndomains == 1 ? "" : "s");
	fprintf(out, "%s\n", topo->smt ? ", SMT" : ", no SMT siblings");
}

void report_topology(FILE *out, const struct topology *topo)
{
	print_machine(out, topo);
	fprintf(out, "placement:");
	for (unsigned int i = 0; i < topo->ncpus; i++)
		fprintf(out, "%s %d", i && topo->domain[i] != topo->domain[i - 1] ? " |" : "",
			topo->order[i]);
	fputc('\n', out);
}

/* A metric's value in a few significant digits; "-" when not measured. */
static void format_metric(char *buf, size_t len, double x)
{
	if (!isfinite(x))
		snprintf(buf, len, "-");
	else if (x == rint(x) || fabs(x) >= 1000)
		snprintf(buf, len, "%.0f", x);
	else if (fabs(x) >= 100)
		snprintf(buf, len, "%.1f", x);
	else if (fabs(x) >= 1)
		snprintf(buf, len, "%.2f", x);
	else
		snprintf(buf, len, "%.3g", x);
}

/* A column's figure, right-aligned in @width; "-" when not measured (a
 * point that completed no operation, or a baseline that did not). */
static void print_figure(FILE *out, int width, int precision, double x)
{
	if (isfinite(x)) {
		/* Fewer decimals where the figure would pass its column
		 * (managed-latency's 20 ms a release, in ns, did). */
		while (precision > 0 && snprintf(NULL, 0, "%.*f", precision, x) > width)
			precision--;
		fprintf(out, " %*.*f", width, precision, x);
	} else
		fprintf(out, " %*s", width, "-");
}

static const struct metric *find_metric(const struct bench_metrics *m, const char *name)
{
	for (unsigned int i = 0; i < m->n; i++)
		if (!strcmp(m->v[i].name, name))
			return &m->v[i];
	return NULL;
}

/* The workload's own figures, if it reported any: see the top of the file. */
static void report_metrics(FILE *out, const struct report *r)
{
	unsigned int ncells = r->nthreads * r->nvariants, ncols = 0, max = 0;
	const struct metric **cols;
	int variant_w = 7, *width;
	char buf[64], unit[64];
	bool units = false;

	for (unsigned int i = 0; i < ncells; i++)
		max += r->results[i].metrics.n;
	if (!max)
		return;
	cols = calloc(max, sizeof(*cols));
	width = calloc(max, sizeof(*width));
	if (!cols || !width)
		bench_die("out of memory");
	/* Columns in first-seen order; each as wide as its name, unit and values. */
	for (unsigned int i = 0; i < ncells; i++) {
		const struct bench_metrics *m = &r->results[i].metrics;
		int len = strlen(r->results[i].variant->name);

		if (len > variant_w)
			variant_w = len;
		for (unsigned int j = 0; j < m->n; j++) {
			unsigned int c = 0;

			while (c < ncols && strcmp(cols[c]->name, m->v[j].name))
				c++;
			if (c == ncols) {
				cols[ncols++] = &m->v[j];
				width[c] = strlen(m->v[j].name);
				if (*m->v[j].unit && (int)strlen(m->v[j].unit) + 2 > width[c])
					width[c] = strlen(m->v[j].unit) + 2;
			}
			format_metric(buf, sizeof(buf), m->v[j].value);
			if ((int)strlen(buf) > width[c])
				width[c] = strlen(buf);
		}
	}

	fprintf(out, "\n%s metrics: the workload's own figures per point%s; -: not measured\n",
		r->workload->name, r->repeat > 1 ? ", mean over the repetitions" : "");
	fprintf(out, "%7s  %-*s", "threads", variant_w, "variant");
	for (unsigned int c = 0; c < ncols; c++)
		fprintf(out, " %*s", width[c], cols[c]->name);
	fputc('\n', out);
	/* The units, under the names, if any metric has one. */
	for (unsigned int c = 0; c < ncols; c++)
		units |= *cols[c]->unit != 0;
	if (units) {
		fprintf(out, "%7s  %-*s", "", variant_w, "");
		for (unsigned int c = 0; c < ncols; c++) {
			if (*cols[c]->unit)
				snprintf(unit, sizeof(unit), "[%s]", cols[c]->unit);
			fprintf(out, " %*s", width[c], *cols[c]->unit ? unit : "");
		}
		fputc('\n', out);
	}
	for (unsigned int i = 0; i < ncells; i++) {
		const struct result *res = &r->results[i];

		fprintf(out, "%7u  %-*s", res->threads, variant_w, res->variant->name);
		for (unsigned int c = 0; c < ncols; c++) {
			const struct metric *x = find_metric(&res->metrics, cols[c]->name);

			format_metric(buf, sizeof(buf), x ? x->value : NAN);
			fprintf(out, " %*s", width[c], buf);
		}
		fputc('\n', out);
	}
	free(width);
	free(cols);
}

/* One --versus cell, a ratio: "0.993", and with several rounds
 * "0.993 (0.650-1.670)". */
static void format_versus(char *buf, size_t len, const struct result *res, unsigned int repeat)
{
	if (!res->versus_rounds)
		snprintf(buf, len, "-");
	else if (repeat == 1)
		snprintf(buf, len, "%.3f", res->versus_median);
	else
		snprintf(buf, len, "%.3f (%.3f-%.3f)", res->versus_median, res->versus_low,
			 res->versus_high);
}

/* A point's throughput per group; NAN (the table's "-", the JSON's null)
 * for a point that completed nothing, as its time per operation. */
static double per_group_rate(const struct result *res)
{
	return res->ops_per_sec > 0 ? res->ops_per_sec / res->groups : NAN;
}

/* The width of the group column ("containers"), 0 for a workload
 * without groups. */
static int group_width(const struct report *r)
{
	return r->workload->group ? (int)strlen(r->workload->group) + 1 : 0;
}

/* The heading of a table's first columns: groups where the workload has
 * them, and threads. */
static void print_lead_head(FILE *out, const struct report *r)
{
	if (r->workload->group)
		fprintf(out, "%ss  ", r->workload->group);
	fprintf(out, "%7s", "threads");
}

/* Row @i's first columns: its group count where the workload has groups,
 * and its thread count; '!' follows the first where it is oversubscribed. */
static void print_lead(FILE *out, const struct report *r, unsigned int i)
{
	char over = r->threads[i] > r->topo->ncpus ? '!' : ' ';

	if (r->workload->group)
		fprintf(out, "%*u%c %7u", group_width(r), r->results[i * r->nvariants].groups,
			over, r->threads[i]);
	else
		fprintf(out, "%6u%c", r->threads[i], over);
}

/* --versus: one row per thread count, led as in the main table; one
 * column per other variant. */
static void report_versus(FILE *out, const struct report *r)
{
	unsigned int short_points = 0;
	int width[r->nvariants];
	char buf[64];

	if (!r->versus)
		return;
	for (unsigned int v = 0; v < r->nvariants; v++)
		width[v] = strlen(r->variants[v]->name);
	for (unsigned int i = 0; i < r->nthreads * r->nvariants; i++) {
		const struct result *res = &r->results[i];

		format_versus(buf, sizeof(buf), res, r->repeat);
		if ((int)strlen(buf) > width[i % r->nvariants])
			width[i % r->nvariants] = strlen(buf);
		short_points += i % r->nvariants != r->versus_column &&
				res->versus_rounds < r->repeat;
	}
	if (r->repeat == 1)
		fprintf(out, "\nversus %s: each variant's throughput over %s's in the same row\n",
			r->versus->name, r->versus->name);
	else
		fprintf(out, "\nversus %s: each variant's throughput over %s's in the same row and "
			"repetition, median (lowest-highest) of the %u repetitions\n",
			r->versus->name, r->versus->name, r->repeat);
	print_lead_head(out, r);
	for (unsigned int v = 0; v < r->nvariants; v++)
		if (v != r->versus_column)
			fprintf(out, "  %*s", width[v], r->variants[v]->name);
	fputc('\n', out);
	for (unsigned int i = 0; i < r->nthreads; i++) {
		print_lead(out, r, i);
		for (unsigned int v = 0; v < r->nvariants; v++) {
			if (v == r->versus_column)
				continue;
			format_versus(buf, sizeof(buf), &r->results[i * r->nvariants + v],
				      r->repeat);
			fprintf(out, "  %*s", width[v], buf);
		}
		fputc('\n', out);
	}
	if (short_points)
		fprintf(out, "%u point%s had repetitions where it or %s completed no %s: "
			"those are left out (-: none left; each point's count: --json)\n",
			short_points, short_points == 1 ? "" : "s", r->versus->name, r->workload->op);
}

/*
 * The probe's range over the run's points (transfer.c): one line, and a
 * warning where the slowest read more than TRANSFER_SWING times the
 * fastest, so that a host that moved the CPUs during the run (or other
 * work that kept them busy) is seen in the table, not only in the JSON's
 * per-sample figures.
 */
#define TRANSFER_SWING 1.5
static void report_transfers(FILE *out, const struct report *r)
{
	unsigned int points = r->nthreads * r->nvariants, measured = 0;
	double lo = INFINITY, hi = 0;

	for (unsigned int i = 0; i < points; i++)
		for (unsigned int k = 0; k < r->repeat; k++) {
			double ns = r->results[i].samples[k].transfer_ns;

			if (!isfinite(ns))
				continue;
			measured++;
			lo = fmin(lo, ns);
			hi = fmax(hi, ns);
		}
	if (!measured)
		return;
	fprintf(out, "line transfer between CPUs %d and %d before each point: ",
		r->topo->order[0], r->topo->order[1]);
	if (hi - lo < 0.5)
		fprintf(out, "%.0f ns\n", lo);
	else
		fprintf(out, "%.0f-%.0f ns\n", lo, hi);
	if (hi > TRANSFER_SWING * lo)
		fprintf(out, "warning: the slowest point's probe read %.1fx the fastest's: the "
			"host moved these CPUs between points, or other work shared them, and "
			"rows measured apart may compare two machines (each point's figure: "
			"--json)\n", hi / lo);
}

void report_table(FILE *out, const struct report *r)
{
	const struct topology *topo = r->topo;
	const char *op = r->workload->op, *group = r->workload->group;
	bool efficiency = !r->workload->no_efficiency, oversubscribed = false;
	char fig_head[40], rate_head[32], cpus[4096], config[32];
	int group_w = group_width(r), fig_w, rate_w, eff_w = 5, cpus_w = 4, config_w = 6, block_w;

	/*
	 * Per variant: ns/<op> and the total, or, for a workload with
	 * groups, the per-group throughput and the total (per-thread time is
	 * not a group's figure); then eff.
	 */
	if (group) {
		snprintf(fig_head, sizeof(fig_head), "per %s", group);
	} else {
		snprintf(fig_head, sizeof(fig_head), "ns/%s", op);
	}
	snprintf(rate_head, sizeof(rate_head), "M%ss/s", op);
	fig_w = strlen(fig_head) > 8 ? (int)strlen(fig_head) : 8;
	rate_w = strlen(rate_head) > 9 ? (int)strlen(rate_head) : 9;
	/*
	 * Wide enough for every figure's whole part (print_figure() then
	 * drops decimals that do not fit) and every eff: a 150 ms scan in ns
	 * passed the 8-wide ns/scan column, and 54914% the 5-wide eff one.
	 */
	for (unsigned int i = 0; i < r->nthreads * r->nvariants; i++) {
		const struct result *res = &r->results[i];
		double fig = group ? per_group_rate(res) : res->ns_per_op;

		if (isfinite(fig))
			fig_w = fmax(fig_w, snprintf(NULL, 0, "%.0f", fig));
		if (efficiency && isfinite(res->efficiency))
			eff_w = fmax(eff_w, snprintf(NULL, 0, "%.0f%%", res->efficiency * 100));
	}
	block_w = fig_w + 1 + rate_w + (efficiency ? eff_w + 1 : 0);
	for (unsigned int i = 0; i < r->nthreads; i++) {
		topology_format_cpus(topo, r->threads[i] < topo->ncpus ? r->threads[i] : topo->ncpus,
				     cpus, sizeof(cpus));
		if ((int)strlen(cpus) > cpus_w)
			cpus_w = strlen(cpus);
		topology_format_config(topo, r->threads[i], config, sizeof(config));
		if ((int)strlen(config) > config_w)
			config_w = strlen(config);
	}

	fprintf(out, "%s: %s\n", r->workload->name, r->workload->help);
	print_machine(out, topo);
	/* At the end of the run: a refusal during it changes the method. */
	fprintf(out, "fast path: %s\nfences: %s\n", r->fast_path, percpuref_fence_method());
	for (char **e = next_library_setting(environ); e; e = next_library_setting(e + 1)) {
		/* A control character as '?': a newline in a value made
		 * header lines of its own ("fast path: ..."). */
		fputs("environment: ", out);
		for (const char *c = *e; *c; c++)
			fputc((unsigned char)*c < 0x20 ? '?' : *c, out);
		fputc('\n', out);
	}
	if (r->library_cpus)
		fprintf(out, "library threads: CPUs %s\n", r->library_cpus);
	else
		fprintf(out, "library threads: where the thread whose call starts them may run\n");
	fprintf(out, "each point: %g s after a %g s warm-up, %s of %u run%s", r->duration,
		r->duration / 5, r->stat, r->repeat, r->repeat == 1 ? "" : "s");
	if (efficiency && r->baseline == 1)
		fprintf(out, "; eff = throughput(N) / (N x throughput(1))");
	else if (efficiency)
		fprintf(out, "; eff = (throughput(N) / N) / (throughput(%u) / %u): the %u-thread "
			"row is 100%%", r->baseline, r->baseline, r->baseline);
	if (group)
		fprintf(out, "\nper %s: %ss/s of one %s = total / %ss", group, op, group, group);
	fprintf(out, "\n\n");

	fprintf(out, "%*s |", (group_w ? group_w + 2 : 0) + 8 + config_w + 1 + cpus_w + 4, "");
	for (unsigned int v = 0; v < r->nvariants; v++) {
		fputc(' ', out);
		center(out, r->variants[v]->name, block_w);
		fprintf(out, " |");
	}
	fputc('\n', out);
	print_lead_head(out, r);
	fprintf(out, " %-*s %-*s %3s |", config_w, "config", cpus_w, "cpus", "L3");
	for (unsigned int v = 0; v < r->nvariants; v++) {
		fprintf(out, " %*s %*s", fig_w, fig_head, rate_w, rate_head);
		if (efficiency)
			fprintf(out, " %*s", eff_w, "eff");
		fprintf(out, " |");
	}
	fputc('\n', out);

	for (unsigned int i = 0; i < r->nthreads; i++) {
		unsigned int n = r->threads[i];
		bool over = n > topo->ncpus;

		oversubscribed |= over;
		topology_format_cpus(topo, over ? topo->ncpus : n, cpus, sizeof(cpus));
		topology_format_config(topo, n, config, sizeof(config));
		print_lead(out, r, i);
		fprintf(out, " %-*s %-*s %3u |", config_w, config, cpus_w, cpus,
			topology_domains_used(topo, n));
		for (unsigned int v = 0; v < r->nvariants; v++) {
			const struct result *res = &r->results[i * r->nvariants + v];

			if (group)
				print_figure(out, fig_w, 0, per_group_rate(res));
			else
				print_figure(out, fig_w, 2, res->ns_per_op);
			/* Below one million a second, three significant digits,
			 * trailing zeros kept: managed-scan's 12,000 scans/s read
			 * "0.0", and managed-latency's 8 releases/s "0.0000"
			 * with four decimals. */
			if (res->ops_per_sec > 0 && res->ops_per_sec < 1e6)
				fprintf(out, " %#*.3g", rate_w, res->ops_per_sec / 1e6);
			else
				fprintf(out, " %*.1f", rate_w, res->ops_per_sec / 1e6);
			if (efficiency && isfinite(res->efficiency))
				fprintf(out, " %*.0f%%", eff_w - 1, res->efficiency * 100);
			else if (efficiency)
				fprintf(out, " %*s", eff_w, "-");
			fprintf(out, " |");
		}
		fputc('\n', out);
	}
	if (oversubscribed)
		fprintf(out, "! oversubscribed: more threads than the %u usable CPUs, pinned "
			"round-robin: threads time-share\n", topo->ncpus);
	if (r->processes)
		fprintf(out, "--processes: a row of T is T one-thread processes at once, "
			"sharing nothing\n");
	report_transfers(out, r);
	report_versus(out, r);
	report_metrics(out, r);
	fflush(out);
}

/* The length of the well-formed UTF-8 sequence at @s (at most @len
 * bytes), or 0: a stray byte, a truncated, overlong or surrogate one. */
static size_t utf8_sequence(const unsigned char *s, size_t len)
{
	size_t n = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] <= 0xdf ? 2 :
		   s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;

	if (!n || n > len)
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
	    (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))
		return 0;
	return n;
}

/* @len bytes of @s as a JSON string: quotes, backslashes and control
 * characters escaped, a byte that is no UTF-8 as U+FFFD (an environment
 * value may hold any bytes; JSON text is UTF-8, and plot.py refused the
 * whole file). */
static void json_string_n(FILE *out, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + len;

	fputc('"', out);
	while (p < end) {
		size_t n = utf8_sequence(p, (size_t)(end - p));

		if (!n) {
			fputs("\\ufffd", out);
			p++;
		} else if (*p == '"' || *p == '\\') {
			fprintf(out, "\\%c", *p++);
		} else if (*p < 0x20) {
			fprintf(out, "\\u%04x", *p++);
		} else {
			fwrite(p, 1, n, out);
			p += n;
		}
	}
	fputc('"', out);
}

static void json_string(FILE *out, const char *s)
{
	json_string_n(out, s, strlen(s));
}

/* {"NAME": "value", ...} for each library_setting() entry. */
static void json_environment(FILE *out)
{
	const char *separator = "";

	fprintf(out, ",\"environment\":{");
	for (char **e = next_library_setting(environ); e; e = next_library_setting(e + 1)) {
		const char *eq = strchr(*e, '=');

		fputs(separator, out);
		json_string_n(out, *e, (size_t)(eq - *e));
		fputc(':', out);
		json_string(out, eq + 1);
		separator = ",";
	}
	fputc('}', out);
}

/* A JSON number, or null for what JSON cannot hold (inf, nan). */
static void json_number(FILE *out, double x)
{
	if (isfinite(x))
		fprintf(out, "%.6g", x);
	else
		fprintf(out, "null");
}

static void json_params(FILE *out, const struct bench_workload *w)
{
	fputc('{', out);
	for (const struct bench_option *o = w->options; o && o->name; o++) {
		if (o != w->options)
			fputc(',', out);
		json_string(out, o->name);
		fputc(':', out);
		switch (o->type) {
		case BENCH_OPT_LONG:
			fprintf(out, "%ld", *(long *)o->value);
			break;
		case BENCH_OPT_DOUBLE:
			json_number(out, *(double *)o->value);
			break;
		case BENCH_OPT_STRING:
			json_string(out, *(const char **)o->value);
			break;
		case BENCH_OPT_BOOL:
			fprintf(out, *(bool *)o->value ? "true" : "false");
			break;
		}
	}
	fputc('}', out);
}

/* {"name":value,...}, and with @units {"name":"unit",...}. */
static void json_metrics(FILE *out, const struct bench_metrics *m, bool units)
{
	fputc('{', out);
	for (unsigned int i = 0; i < m->n; i++) {
		if (i)
			fputc(',', out);
		json_string(out, m->v[i].name);
		fputc(':', out);
		if (units)
			json_string(out, m->v[i].unit);
		else
			json_number(out, m->v[i].value);
	}
	fputc('}', out);
}

static void json_machine(FILE *out, const struct topology *topo)
{
	struct utsname uts;
	char host[256] = "";

	if (uname(&uts))
		strcpy(uts.release, "unknown");
	gethostname(host, sizeof(host) - 1);
	fprintf(out, "{\"model\":");
	json_string(out, topo->model);
	fprintf(out, ",\"cpus_online\":%u,\"cpus\":%u,\"l3_domains\":%u,\"domain_source\":\"%s\""
		",\"smt\":%s,\"kernel\":", topo->online, topo->ncpus, topo->ndomains,
		topo->domain_source, topo->smt ? "true" : "false");
	json_string(out, uts.release);
	fprintf(out, ",\"hostname\":");
	json_string(out, host);
	fputc('}', out);
}

void report_json(FILE *out, const struct report *r)
{
	const struct topology *topo = r->topo;
	char config[32];

	for (unsigned int i = 0; i < r->nthreads; i++) {
		unsigned int n = r->threads[i], placed = n < topo->ncpus ? n : topo->ncpus;

		topology_format_config(topo, n, config, sizeof(config));

		for (unsigned int v = 0; v < r->nvariants; v++) {
			const struct result *res = &r->results[i * r->nvariants + v];

			fprintf(out, "{\"schema\":\"percpuref-bench/1\",\"workload\":");
			json_string(out, r->workload->name);
			fprintf(out, ",\"variant\":");
			json_string(out, res->variant->name);
			fprintf(out, ",\"threads\":%u,\"config\":\"%s\",\"op\":", n, config);
			json_string(out, r->workload->op);
			fprintf(out, ",\"ops_per_sec\":");
			json_number(out, res->ops_per_sec);
			fprintf(out, ",\"ns_per_op\":");
			json_number(out, res->ns_per_op);
			if (r->workload->group) {
				fprintf(out, ",\"group\":");
				json_string(out, r->workload->group);
				fprintf(out, ",\"groups\":%u,\"ops_per_sec_per_group\":", res->groups);
				json_number(out, per_group_rate(res));
			}
			fprintf(out, ",\"efficiency\":");
			if (res->efficiency < 0) {
				fprintf(out, "null,\"baseline_threads\":null");
			} else {
				json_number(out, res->efficiency);
				fprintf(out, ",\"baseline_threads\":%u", r->baseline);
			}
			fprintf(out, ",\"versus\":");
			if (r->versus && v != r->versus_column) {
				fprintf(out, "{\"variant\":");
				json_string(out, r->versus->name);
				fprintf(out, ",\"median\":");
				json_number(out, res->versus_median);
				fprintf(out, ",\"low\":");
				json_number(out, res->versus_low);
				fprintf(out, ",\"high\":");
				json_number(out, res->versus_high);
				fprintf(out, ",\"rounds\":%u}", res->versus_rounds);
			} else {
				fprintf(out, "null");
			}
			fprintf(out, ",\"oversubscribed\":%s,\"processes\":%s,\"cpus\":[",
				n > topo->ncpus ? "true" : "false", r->processes ? "true" : "false");
			for (unsigned int c = 0; c < placed; c++)
				fprintf(out, "%s%d", c ? "," : "", topo->order[c]);
			fprintf(out, "],\"l3_domains_used\":%u,\"stat\":\"%s\",\"repeat\":%u,"
				"\"samples\":[", topology_domains_used(topo, n), r->stat, r->repeat);
			for (unsigned int k = 0; k < r->repeat; k++) {
				fprintf(out, "%s{\"ops\":%llu,\"seconds\":", k ? "," : "",
					(unsigned long long)res->samples[k].ops);
				json_number(out, res->samples[k].seconds);
				fprintf(out, ",\"line_transfer_ns\":");
				json_number(out, res->samples[k].transfer_ns);
				if (res->samples[k].metrics.n) {
					fprintf(out, ",\"metrics\":");
					json_metrics(out, &res->samples[k].metrics, false);
				}
				fputc('}', out);
			}
			fprintf(out, "],\"duration_s\":");
			json_number(out, r->duration);
			fprintf(out, ",\"metrics\":");
			json_metrics(out, &res->metrics, false);
			fprintf(out, ",\"metric_units\":");
			json_metrics(out, &res->metrics, true);
			fprintf(out, ",\"params\":");
			json_params(out, r->workload);
			fprintf(out, ",\"machine\":");
			json_machine(out, topo);
			fprintf(out, ",\"fast_path\":");
			json_string(out, r->fast_path);
			fprintf(out, ",\"fences\":");
			json_string(out, percpuref_fence_method());
			json_environment(out);
			fprintf(out, ",\"library_cpus\":");
			if (r->library_cpus)
				json_string(out, r->library_cpus);
			else
				fprintf(out, "null");
			fprintf(out, ",\"started\":\"%s\"}\n", r->started);
		}
	}
	fflush(out);
}
