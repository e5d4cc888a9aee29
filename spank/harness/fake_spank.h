/*
 * fake_spank.h - a SPANK host for unit tests of the microvm plugin.
 *
 * It provides the spank_* and slurm_* functions the plugin calls, with the
 * availability rules of Slurm 22.05 (src/common/plugstack.c): which items
 * exist in which context, spank_option_register only in init,
 * spank_getenv/setenv only in the remote context, S_TASK_ID only in task
 * callbacks. Tests set the context, items, job env and argv, then drive the
 * plugin's callbacks in Slurm's order.
 */
#ifndef FAKE_SPANK_H
#define FAKE_SPANK_H

#include <stdint.h>
#include <sys/types.h>

#include <slurm/spank.h>

enum fake_hook {
	FAKE_INIT,
	FAKE_INIT_POST_OPT,
	FAKE_LOCAL_USER_INIT,
	FAKE_TASK_POST_FORK,
	FAKE_TASK_INIT,
	FAKE_TASK_EXIT,
	FAKE_EXIT,
	FAKE_JOB_EPILOG,
};

/* Forgets everything: the fake's state and the plugin's (mv_state_reset). */
void fake_reset(void);

void fake_set_context(int ctx);
/* uint32 items: S_JOB_ID, S_JOB_STEPID, S_SLURM_RESTART_COUNT,
 * S_JOB_LOCAL_TASK_COUNT, S_JOB_UID, S_JOB_GID. */
void fake_set_u32(int item, uint32_t v);
void fake_set_u64(int item, uint64_t v); /* S_STEP_ALLOC_MEM */
void fake_set_str(int item, const char *s); /* S_STEP_ALLOC_CORES */
void fake_set_gids(const uint32_t *gids, int n);
/* Makes spank_get_item(item) fail (ESPANK_BAD_ARG, like an old Slurm). */
void fake_unset(int item);
void fake_set_argv(int argc, char **argv);
void fake_setenv(const char *name, const char *value);

/*
 * slurm_load_job(): the job's pn_min_memory (MEM_PER_CPU flag included);
 * fail makes the call fail. Calls are counted (fake_load_job_calls).
 */
void fake_set_job_mem(uint64_t pn_min_memory, int fail);
int fake_load_job_calls(void);

/* Calls the plugin's callback for hook with plugstack args (ac, av). */
int fake_call(int hook, int task, int ac, char **av);
/* Calls the callback of a registered option; -1000 if none. */
int fake_option(const char *name, const char *optarg, int remote);

int fake_argc(void);
const char *fake_argv(int i);
const char *fake_getenv(const char *name);
const char *fake_log(void);
int fake_noptions(void);
const char *fake_option_name(int i);
int fake_option_has_arg(int i);
const char *fake_option_arginfo(int i); /* NULL when none */
const char *fake_option_usage(int i);

#endif
