/*
 * microvm.c - the SPANK entry points of slurm-microvm: a dispatch on
 * spank_context() into local.c (srun/sbatch/salloc), remote.c (slurmstepd)
 * and jobscript.c (job epilog).
 *
 * Which callback runs where, as root or as the user (Slurm 22.05, see
 * DESIGN.md "The flow of one step"):
 *   init            all contexts: plugstack args, option registration
 *   (option cbs)    srun/sbatch parse; slurmstepd replays them (remote=1),
 *                   possibly twice with the same value
 *   init_post_opt   srun/sbatch/salloc: validate (user);
 *                   slurmstepd: prepare (root)
 *   local_user_init srun: refuse --multi-prog before launch (user)
 *   task_post_fork  slurmstepd, local task 0: detached start (root)
 *   task_init       task, right before exec: argv swap (user)
 *   task_exit       slurmstepd: stop after the last local task (root)
 *   exit            slurmstepd: stop again as a backstop (root)
 *   job_epilog      job script context: gc of the job (root)
 */
#include <stdlib.h>
#include <string.h>

#include "microvm.h"

SPANK_PLUGIN(microvm, 1);

struct mv_state mv;

void mv_state_reset(void)
{
	free(mv.cfg.launcher);
	free(mv.cfg.exec);
	free(mv.cfg.config);
	free(mv.opt.image);
	free(mv.opt.mounts);
	free(mv.opt.workdir);
	free(mv.opt.mpi);
	free(mv.opt.network);
	free(mv.step.exited);
	free(mv.step.failure);
	memset(&mv, 0, sizeof(mv));
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	if (mv_config_load(ac, av) < 0)
		return -1;

	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
	case S_CTX_REMOTE:
		return mv_options_register(sp);
	default:
		/* slurmd: nothing to do, but bad plugstack args fail early. */
		return 0;
	}
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	if (mv_config_load(ac, av) < 0)
		return -1;

	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return mv_local_init_post_opt(sp);
	case S_CTX_REMOTE:
		return mv_remote_init_post_opt(sp);
	default:
		return 0;
	}
}

int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_context() != S_CTX_LOCAL)
		return 0;
	return mv_local_user_init(sp);
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	return mv_remote_task_post_fork(sp);
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	return mv_remote_task_init(sp);
}

int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	return mv_remote_task_exit(sp);
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	int rc = 0;

	(void)ac;
	(void)av;
	if (spank_context() == S_CTX_REMOTE)
		rc = mv_remote_exit(sp);
	mv_state_reset();
	return rc;
}

int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	/* No slurm_spank_init in the job script context: load args here. */
	if (mv_config_load(ac, av) < 0)
		return -1;
	if (spank_context() != S_CTX_JOB_SCRIPT)
		return 0;
	return mv_job_epilog(sp);
}
