/*
 * fake_spank.c - the SPANK host of the unit tests (see fake_spank.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/slurm.h>

#include "fake_spank.h"

/* The plugin's entry points and reset (spank/microvm.c). */
extern spank_f slurm_spank_init, slurm_spank_init_post_opt,
	slurm_spank_local_user_init, slurm_spank_task_post_fork,
	slurm_spank_task_init, slurm_spank_task_exit, slurm_spank_exit,
	slurm_spank_job_epilog;
void mv_state_reset(void);

struct spank_handle {
	int magic;
};

#define FAKE_MAX_ITEMS 64
#define FAKE_MAX_OPTS 32

static struct {
	struct spank_handle handle;
	spank_context_t ctx;
	int hook, task;

	int have[FAKE_MAX_ITEMS];
	uint32_t u32[FAKE_MAX_ITEMS];
	uint64_t u64[FAKE_MAX_ITEMS];
	char *str[FAKE_MAX_ITEMS];
	gid_t *gids;
	int ngids;

	int argc;
	char **argv;
	char *argv0; /* the original argv[0], which the plugin may replace */
	char **env;
	int nenv;

	struct spank_option opts[FAKE_MAX_OPTS];
	int nopts;

	char *log;
	size_t loglen;

	uint64_t job_mem;
	int job_fail, job_loads;
	uint32_t loaded_job;
} fake;

static void fake_free_argv(void)
{
	int i;

	for (i = 0; fake.argv && i < fake.argc; i++)
		if (fake.argv[i] != fake.argv0)
			free(fake.argv[i]);
	free(fake.argv0);
	free(fake.argv);
	fake.argv = NULL;
	fake.argv0 = NULL;
	fake.argc = 0;
}

void fake_reset(void)
{
	int i;

	mv_state_reset();
	for (i = 0; i < FAKE_MAX_ITEMS; i++)
		free(fake.str[i]);
	free(fake.gids);
	fake_free_argv();
	for (i = 0; i < fake.nenv; i++)
		free(fake.env[i]);
	free(fake.env);
	for (i = 0; i < fake.nopts; i++) {
		free(fake.opts[i].name);
		free(fake.opts[i].arginfo);
		free(fake.opts[i].usage);
	}
	free(fake.log);
	memset(&fake, 0, sizeof(fake));
	fake.handle.magic = 0x00a5a500;
	fake.task = -1;
}

void fake_set_context(int ctx)
{
	fake.ctx = (spank_context_t)ctx;
}

void fake_set_u32(int item, uint32_t v)
{
	fake.have[item] = 1;
	fake.u32[item] = v;
}

void fake_set_u64(int item, uint64_t v)
{
	fake.have[item] = 1;
	fake.u64[item] = v;
}

void fake_set_str(int item, const char *s)
{
	fake.have[item] = 1;
	free(fake.str[item]);
	fake.str[item] = s ? strdup(s) : NULL;
}

void fake_set_gids(const uint32_t *gids, int n)
{
	int i;

	free(fake.gids);
	fake.gids = calloc(n > 0 ? (size_t)n : 1, sizeof(gid_t));
	for (i = 0; i < n; i++)
		fake.gids[i] = (gid_t)gids[i];
	fake.ngids = n;
	fake.have[S_JOB_SUPPLEMENTARY_GIDS] = 1;
}

void fake_unset(int item)
{
	fake.have[item] = 0;
}

void fake_set_argv(int argc, char **argv)
{
	int i;

	fake_free_argv();
	fake.argv = calloc((size_t)argc + 1, sizeof(char *));
	for (i = 0; i < argc; i++)
		fake.argv[i] = strdup(argv[i]);
	fake.argc = argc;
	fake.argv0 = argc ? fake.argv[0] : NULL;
	fake.have[S_JOB_ARGV] = 1;
}

static int fake_env_index(const char *name)
{
	size_t n = strlen(name);
	int i;

	for (i = 0; i < fake.nenv; i++)
		if (!strncmp(fake.env[i], name, n) && fake.env[i][n] == '=')
			return i;
	return -1;
}

void fake_setenv(const char *name, const char *value)
{
	char *kv = NULL;
	int i;

	if (asprintf(&kv, "%s=%s", name, value) < 0)
		abort();
	if ((i = fake_env_index(name)) >= 0) {
		free(fake.env[i]);
		fake.env[i] = kv;
		return;
	}
	fake.env = realloc(fake.env, sizeof(char *) * (size_t)(fake.nenv + 1));
	fake.env[fake.nenv++] = kv;
}

const char *fake_getenv(const char *name)
{
	int i = fake_env_index(name);

	return i < 0 ? NULL : strchr(fake.env[i], '=') + 1;
}

int fake_argc(void)
{
	return fake.argc;
}

const char *fake_argv(int i)
{
	return (i >= 0 && i < fake.argc) ? fake.argv[i] : NULL;
}

const char *fake_log(void)
{
	return fake.log ? fake.log : "";
}

int fake_noptions(void)
{
	return fake.nopts;
}

const char *fake_option_name(int i)
{
	return fake.opts[i].name;
}

int fake_option_has_arg(int i)
{
	return fake.opts[i].has_arg;
}

const char *fake_option_arginfo(int i)
{
	return fake.opts[i].arginfo;
}

const char *fake_option_usage(int i)
{
	return fake.opts[i].usage;
}

int fake_call(int hook, int task, int ac, char **av)
{
	spank_f *fn = NULL;
	int rc;

	switch (hook) {
	case FAKE_INIT: fn = slurm_spank_init; break;
	case FAKE_INIT_POST_OPT: fn = slurm_spank_init_post_opt; break;
	case FAKE_LOCAL_USER_INIT: fn = slurm_spank_local_user_init; break;
	case FAKE_TASK_POST_FORK: fn = slurm_spank_task_post_fork; break;
	case FAKE_TASK_INIT: fn = slurm_spank_task_init; break;
	case FAKE_TASK_EXIT: fn = slurm_spank_task_exit; break;
	case FAKE_EXIT: fn = slurm_spank_exit; break;
	case FAKE_JOB_EPILOG: fn = slurm_spank_job_epilog; break;
	default: return -999;
	}
	fake.hook = hook;
	fake.task = task;
	rc = fn(&fake.handle, ac, av);
	fake.hook = -1;
	fake.task = -1;
	return rc;
}

int fake_option(const char *name, const char *optarg, int remote)
{
	int i;

	for (i = 0; i < fake.nopts; i++)
		if (!strcmp(fake.opts[i].name, name))
			return fake.opts[i].cb(fake.opts[i].val, optarg,
					       remote);
	return -1000;
}

/* ------------------------------------------------ the SPANK API itself */

spank_context_t spank_context(void)
{
	return fake.ctx;
}

const char *spank_strerror(spank_err_t err)
{
	switch ((int)err) {
	case ESPANK_SUCCESS: return "Success";
	case ESPANK_BAD_ARG: return "Bad argument";
	case ESPANK_NOT_TASK: return "Not in task context";
	case ESPANK_ENV_EXISTS: return "Environment variable exists";
	case ESPANK_ENV_NOEXIST: return "No such environment variable";
	case ESPANK_NOSPACE: return "Buffer too small";
	case ESPANK_NOT_REMOTE: return "Valid only in remote context";
	case ESPANK_NOT_AVAIL: return "Item not available from this callback";
	case ESPANK_NOT_LOCAL: return "Valid only in local or allocator context";
	default: return "Generic error";
	}
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
	struct spank_option *o;
	int i;

	if (sp != &fake.handle || fake.hook != FAKE_INIT)
		return ESPANK_BAD_ARG;
	if (!opt || !opt->name || !opt->usage ||
	    strlen(opt->name) > SPANK_OPTION_MAXLEN)
		return ESPANK_BAD_ARG;
	for (i = 0; i < fake.nopts; i++)
		if (!strcmp(fake.opts[i].name, opt->name))
			return ESPANK_BAD_ARG; /* Slurm disables duplicates */
	if (fake.nopts == FAKE_MAX_OPTS)
		return ESPANK_NOSPACE;
	o = &fake.opts[fake.nopts++];
	o->name = strdup(opt->name);
	o->arginfo = opt->arginfo ? strdup(opt->arginfo) : NULL;
	o->usage = strdup(opt->usage);
	o->has_arg = opt->has_arg;
	o->val = opt->val;
	o->cb = opt->cb;
	return ESPANK_SUCCESS;
}

/* Slurm 22.05 _check_spank_item_validity(). */
static spank_err_t fake_item_valid(spank_item_t item)
{
	int local_ok = 0;

	switch (item) {
	case S_JOB_UID: case S_JOB_GID: case S_JOB_ID: case S_JOB_STEPID:
	case S_JOB_ARGV: case S_JOB_ENV: case S_JOB_TOTAL_TASK_COUNT:
	case S_JOB_NNODES:
		local_ok = 1;
		break;
	default:
		break;
	}
	switch (fake.ctx) {
	case S_CTX_SLURMD:
		return ESPANK_NOT_AVAIL;
	case S_CTX_JOB_SCRIPT:
		if (item != S_JOB_GID && item != S_JOB_UID && item != S_JOB_ID)
			return ESPANK_NOT_AVAIL;
		return ESPANK_SUCCESS;
	case S_CTX_LOCAL:
		if (!local_ok)
			return ESPANK_NOT_REMOTE;
		/* srun passes its job only to local_user_init */
		if (fake.hook != FAKE_LOCAL_USER_INIT)
			return ESPANK_NOT_AVAIL;
		return ESPANK_SUCCESS;
	case S_CTX_ALLOCATOR:
		if (item == S_JOB_UID || item == S_JOB_GID)
			return ESPANK_NOT_AVAIL;
		return local_ok ? ESPANK_BAD_ARG : ESPANK_NOT_REMOTE;
	case S_CTX_REMOTE:
		return ESPANK_SUCCESS;
	default:
		return ESPANK_BAD_ARG;
	}
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	spank_err_t rc;
	va_list ap;

	if (sp != &fake.handle || (int)item < 0 || item >= FAKE_MAX_ITEMS)
		return ESPANK_BAD_ARG;
	if ((rc = fake_item_valid(item)) != ESPANK_SUCCESS)
		return rc;

	va_start(ap, item);
	switch (item) {
	case S_TASK_ID: {
		int *p = va_arg(ap, int *);

		if (fake.task < 0) {
			*p = -1;
			rc = ESPANK_NOT_TASK;
		} else {
			*p = fake.task;
		}
		break;
	}
	case S_JOB_ARGV: {
		int *pc = va_arg(ap, int *);
		char ***pv = va_arg(ap, char ***);

		*pc = fake.argc;
		*pv = fake.argv;
		break;
	}
	case S_JOB_SUPPLEMENTARY_GIDS: {
		gid_t **pg = va_arg(ap, gid_t **);
		int *pn = va_arg(ap, int *);

		*pg = fake.gids;
		*pn = fake.ngids;
		break;
	}
	case S_JOB_UID: {
		uid_t *p = va_arg(ap, uid_t *);

		if (!fake.have[item])
			rc = ESPANK_BAD_ARG;
		else
			*p = (uid_t)fake.u32[item];
		break;
	}
	case S_JOB_GID: {
		gid_t *p = va_arg(ap, gid_t *);

		if (!fake.have[item])
			rc = ESPANK_BAD_ARG;
		else
			*p = (gid_t)fake.u32[item];
		break;
	}
	case S_JOB_ID: case S_JOB_STEPID: case S_SLURM_RESTART_COUNT:
	case S_JOB_LOCAL_TASK_COUNT: case S_JOB_NNODES: case S_JOB_NODEID:
	case S_JOB_TOTAL_TASK_COUNT: {
		uint32_t *p = va_arg(ap, uint32_t *);

		if (!fake.have[item])
			rc = ESPANK_BAD_ARG;
		else
			*p = fake.u32[item];
		break;
	}
	case S_STEP_ALLOC_MEM: case S_JOB_ALLOC_MEM: {
		uint64_t *p = va_arg(ap, uint64_t *);

		if (!fake.have[item])
			rc = ESPANK_BAD_ARG;
		else
			*p = fake.u64[item];
		break;
	}
	case S_STEP_ALLOC_CORES: case S_JOB_ALLOC_CORES: {
		char **p = va_arg(ap, char **);

		if (!fake.have[item])
			rc = ESPANK_BAD_ARG;
		else
			*p = fake.str[item];
		break;
	}
	default:
		rc = ESPANK_BAD_ARG;
		break;
	}
	va_end(ap);
	return rc;
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
	const char *v;

	if (sp != &fake.handle)
		return ESPANK_BAD_ARG;
	if (fake.ctx != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	if (len < 0)
		return ESPANK_BAD_ARG;
	if (!(v = fake_getenv(var)))
		return ESPANK_ENV_NOEXIST;
	if (strlen(v) >= (size_t)len)
		return ESPANK_NOSPACE;
	strcpy(buf, v);
	return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val,
			 int overwrite)
{
	if (sp != &fake.handle)
		return ESPANK_BAD_ARG;
	if (fake.ctx != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	if (!var || !val)
		return ESPANK_BAD_ARG;
	if (fake_getenv(var) && !overwrite)
		return ESPANK_ENV_EXISTS;
	fake_setenv(var, val);
	return ESPANK_SUCCESS;
}

static void fake_vlog(const char *level, const char *fmt, va_list ap)
{
	char *msg = NULL, *line = NULL;
	int n;

	if (vasprintf(&msg, fmt, ap) < 0)
		abort();
	n = asprintf(&line, "%s: %s\n", level, msg);
	if (n < 0)
		abort();
	fake.log = realloc(fake.log, fake.loglen + (size_t)n + 1);
	memcpy(fake.log + fake.loglen, line, (size_t)n + 1);
	fake.loglen += (size_t)n;
	if (getenv("FAKE_SPANK_VERBOSE"))
		fputs(line, stderr);
	free(msg);
	free(line);
}

#define FAKE_LOGGER(fn, level)                                               \
	void fn(const char *fmt, ...)                                        \
	{                                                                    \
		va_list ap;                                                  \
		va_start(ap, fmt);                                           \
		fake_vlog(level, fmt, ap);                                   \
		va_end(ap);                                                  \
	}

FAKE_LOGGER(slurm_error, "error")
FAKE_LOGGER(slurm_info, "info")
FAKE_LOGGER(slurm_verbose, "verbose")
FAKE_LOGGER(slurm_debug, "debug")
FAKE_LOGGER(slurm_debug2, "debug2")
FAKE_LOGGER(slurm_debug3, "debug3")

/* ------------------------------------------- libslurm: slurm_load_job */

void fake_set_job_mem(uint64_t pn_min_memory, int fail)
{
	fake.job_mem = pn_min_memory;
	fake.job_fail = fail;
}

int fake_load_job_calls(void)
{
	return fake.job_loads;
}

int slurm_load_job(job_info_msg_t **resp, uint32_t job_id,
		   uint16_t show_flags)
{
	job_info_msg_t *m;

	(void)show_flags;
	fake.job_loads++;
	fake.loaded_job = job_id;
	*resp = NULL;
	if (fake.job_fail || !fake.have[S_JOB_ID] || job_id != fake.u32[S_JOB_ID])
		return -1;
	m = calloc(1, sizeof(*m));
	m->record_count = 1;
	m->job_array = calloc(1, sizeof(slurm_job_info_t));
	m->job_array[0].job_id = job_id;
	m->job_array[0].pn_min_memory = fake.job_mem;
	*resp = m;
	return 0;
}

void slurm_free_job_info_msg(job_info_msg_t *m)
{
	if (!m)
		return;
	free(m->job_array);
	free(m);
}
