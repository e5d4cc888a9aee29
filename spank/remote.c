/*
 * remote.c - slurmstepd (remote context): hand the step to the launcher.
 *
 *   init_post_opt   root   <launcher> prepare ...     synchronous
 *   task_post_fork  root   <launcher> start ...       detached, task 0 only
 *   task_init       user   argv[0] -> exec entry, SLURM_MICROVM_* env
 *   task_exit       root   <launcher> stop ...        after the last task
 *   exit            root   <launcher> stop ...        backstop
 *
 * The batch step (sbatch --microvm), the extern step and the interactive
 * step run on the host: --microvm applies to the steps launched inside them.
 *
 * Once a step is a --microvm step, its tasks never run on the host: when
 * anything before the exec fails (prepare, --multi-prog, ...), task_init
 * refuses every task with the reason, which reaches the user's stderr.
 */
#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/slurm.h>

#include "microvm.h"

#ifndef SLURM_BATCH_SCRIPT
#define SLURM_BATCH_SCRIPT (0xfffffffb)
#endif
#ifndef SLURM_EXTERN_CONT
#define SLURM_EXTERN_CONT (0xfffffffc)
#endif

/* Names the steps that stay on the host, NULL for an ordinary step. */
static const char *mv_host_step(uint32_t step)
{
	if (step == SLURM_BATCH_SCRIPT)
		return "batch";
	if (step == SLURM_EXTERN_CONT)
		return "extern";
#ifdef SLURM_INTERACTIVE_STEP
	if (step == SLURM_INTERACTIVE_STEP)
		return "interactive";
#endif
	return NULL;
}

/* launcher --config F <sub> --job J --step S --restart R */
static void mv_argv_step(struct mv_argv *a, const char *sub)
{
	mv_argv_launcher(a, sub);
	mv_argv_add(a, "--job");
	mv_argv_addf(a, "%u", mv.step.job);
	mv_argv_add(a, "--step");
	mv_argv_addf(a, "%u", mv.step.step);
	mv_argv_add(a, "--restart");
	mv_argv_addf(a, "%u", mv.step.restart);
	if (mv.step.node[0]) {
		mv_argv_add(a, "--node");
		mv_argv_add(a, mv.step.node);
	}
}

static int mv_remote_stop(const char *why)
{
	struct mv_argv a = { 0 };
	int rc;

	mv_debug("step %u.%u: stop (%s)", mv.step.job, mv.step.step, why);
	mv_argv_step(&a, "stop");
	rc = mv_run("stop", &a, mv_clean_env, MV_OUTPUT_LOG, mv.cfg.timeout_s,
		    NULL);
	mv_argv_free(&a);
	if (rc < 0)
		mv_error("step %u.%u: stop failed (%s): the job epilog's gc "
			 "will retry", mv.step.job, mv.step.step, why);
	return rc;
}

/*
 * Records why the step cannot run (the first reason is kept) and logs it.
 * init_post_opt does not fail the step for it: slurmstepd would report only
 * "Plugin initialization failed" to srun, which then exits 0 (measured on
 * 22.05). task_init refuses every task with this reason instead, on the
 * user's stderr, and the tasks exit 1.
 */
static void mv_step_fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));

static void mv_step_fail(const char *fmt, ...)
{
	char *msg = NULL;
	va_list ap;

	va_start(ap, fmt);
	if (vasprintf(&msg, fmt, ap) < 0)
		msg = NULL;
	va_end(ap);
	mv_error("step %u.%u: %s", mv.step.job, mv.step.step,
		 msg ? msg : "out of memory");
	if (!mv.step.failure)
		mv.step.failure = msg;
	else
		free(msg);
}

/*
 * Reads the job's environment variable name into buf ("" when unset).
 * Returns -1, with the step failed, when it cannot be read whole.
 */
static int mv_getenv(spank_t sp, const char *name, char *buf, int len)
{
	spank_err_t err = spank_getenv(sp, name, buf, len);

	if (err == ESPANK_ENV_NOEXIST) {
		buf[0] = '\0';
		return 0;
	}
	if (err != ESPANK_SUCCESS) {
		mv_step_fail("cannot read %s of the job: %s", name,
			     spank_strerror(err));
		return -1;
	}
	return 0;
}

/* The login name of uid (getpwuid_r, growing the buffer on ERANGE). */
static char *mv_user_name(uid_t uid, int *err)
{
	long hint = sysconf(_SC_GETPW_R_SIZE_MAX);
	size_t len = hint > 0 ? (size_t)hint : 1024;
	struct passwd pw, *res = NULL;
	char *buf, *name;
	int rc;

	for (;;) {
		if (!(buf = malloc(len))) {
			*err = ENOMEM;
			return NULL;
		}
		rc = getpwuid_r(uid, &pw, buf, len, &res);
		if (rc != ERANGE || len >= (1u << 20))
			break;
		free(buf);
		len *= 2;
	}
	*err = rc;
	name = (!rc && res) ? strdup(pw.pw_name) : NULL;
	free(buf);
	return name;
}

/* "g1,g2,..." of the job's supplementary groups ("" when none). */
static char *mv_groups(spank_t sp)
{
	gid_t *gids = NULL;
	int i, n = 0;
	size_t len = 1;
	char *s, *p;

	if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &n) !=
	    ESPANK_SUCCESS || !gids || n < 0)
		n = 0;
	len += (size_t)n * 11;
	if (!(s = malloc(len)))
		return NULL;
	p = s;
	*p = '\0';
	for (i = 0; i < n; i++)
		p += sprintf(p, "%s%u", i ? "," : "", (unsigned)gids[i]);
	return s;
}

/*
 * slurmstepd, root, before any task exists: record the step and run
 *   <launcher> --config F prepare --job J --step S --restart R --uid U
 *     --gid G --groups g1,g2 --user NAME --image IMG --cores CORES
 *     --mem-mb M [--mem-per-node SLURM_MEM_PER_NODE]
 *     [--mem-per-cpu SLURM_MEM_PER_CPU] --gpus GPUS --tasks N
 *     [--cwd SLURM_SUBMIT_DIR] [--debug]
 *     [--mounts ...]
 * Returns -1 only when the step cannot even be named; any later failure is
 * recorded (mv_step_fail) and refuses the tasks.
 */
int mv_remote_init_post_opt(spank_t sp)
{
	struct mv_step *s = &mv.step;
	struct mv_argv a = { 0 };
	char gpus[4096] = "", cwd[4096] = "", menv[8192] = "";
	char nodes[8192] = "";
	char mem_node[64] = "", mem_cpu[64] = "";
	char *user = NULL, *groups = NULL, *cores = NULL, *why = NULL;
	char **argv = NULL;
	int argc = 0, uerr = 0;
	uint64_t mem = 0;
	const char *host, *node, *conf;
	spank_err_t err;
	char *orphan = NULL;
	uid_t uid;
	gid_t gid;

	/* The step's environment holds srun's SLURM_MICROVM_*: the same
	 * options srun validated. */
	if (mv_options_env(sp, 1) < 0)
		return -1;
	/* srun refuses --microvm-* without --microvm; should such a step
	 * arrive anyway, its tasks are refused, never run on the host. */
	if (!mv.opt.image && !(orphan = mv_options_orphan()))
		return 0;

	if ((err = spank_get_item(sp, S_JOB_ID, &s->job)) != ESPANK_SUCCESS ||
	    (err = spank_get_item(sp, S_JOB_STEPID, &s->step)) !=
	    ESPANK_SUCCESS) {
		mv_error("cannot read the job and step id: %s",
			 spank_strerror(err));
		free(orphan);
		return -1;
	}
	if ((host = mv_host_step(s->step))) {
		mv_debug("job %u: the %s step runs on the host; --microvm "
			 "applies to the steps launched inside it", s->job,
			 host);
		free(orphan);
		return 0;
	}
	if (spank_get_item(sp, S_SLURM_RESTART_COUNT, &s->restart) !=
	    ESPANK_SUCCESS)
		s->restart = 0;
	/*
	 * slurmstepd sets SLURMD_NODENAME in its own environment (the node
	 * name, which differs from the hostname under multiple-slurmd); the
	 * launcher checks the name.
	 */
	node = getenv("SLURMD_NODENAME");
	if (node && strlen(node) < sizeof(s->node))
		strcpy(s->node, node);

	/* From here on the tasks never run outside the microVM. */
	s->active = 1;
	if (orphan) {
		mv_step_fail("%s", orphan);
		free(orphan);
		return 0;
	}

	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) == ESPANK_SUCCESS &&
	    mv_is_multi_prog_data(argc, argv)) {
		s->multi_prog = 1;
		mv_debug("step %u.%u: --multi-prog: every task is refused",
			 s->job, s->step);
		return 0;
	}

	if ((err = spank_get_item(sp, S_JOB_UID, &uid)) != ESPANK_SUCCESS ||
	    (err = spank_get_item(sp, S_JOB_GID, &gid)) != ESPANK_SUCCESS ||
	    (err = spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &s->ntasks)) !=
	    ESPANK_SUCCESS) {
		mv_step_fail("cannot read the job's uid, gid and local task "
			     "count: %s", spank_strerror(err));
		return 0;
	}
	if (spank_get_item(sp, S_STEP_ALLOC_CORES, &cores) != ESPANK_SUCCESS)
		cores = NULL;
	if (spank_get_item(sp, S_STEP_ALLOC_MEM, &mem) != ESPANK_SUCCESS)
		mem = 0;
	/* The job's own --mem/--mem-per-cpu: where Slurm allocates no memory
	 * (no CR_*_Memory) S_STEP_ALLOC_MEM is 0 and only these tell the
	 * launcher what the job asked for (local.c exports them in srun). */
	if (mv_getenv(sp, "SLURM_MEM_PER_NODE", mem_node, sizeof(mem_node)) < 0 ||
	    mv_getenv(sp, "SLURM_MEM_PER_CPU", mem_cpu, sizeof(mem_cpu)) < 0)
		return 0;
	err = spank_getenv(sp, "SLURM_STEP_GPUS", gpus, sizeof(gpus));
	if (err != ESPANK_SUCCESS && err != ESPANK_ENV_NOEXIST) {
		mv_step_fail("cannot read SLURM_STEP_GPUS: %s",
			     spank_strerror(err));
		return 0;
	}
	if (err != ESPANK_SUCCESS)
		gpus[0] = '\0';
	/* Where srun ran: a relative image path (./img) is relative to it,
	 * as `validate` saw it on the submit host. */
	if (spank_getenv(sp, "SLURM_SUBMIT_DIR", cwd, sizeof(cwd)) !=
	    ESPANK_SUCCESS)
		cwd[0] = '\0';

	if (!(s->exited = calloc(s->ntasks ? s->ntasks : 1, 1)) ||
	    !(groups = mv_groups(sp))) {
		mv_step_fail("out of memory");
		goto out;
	}
	if (!(user = mv_user_name(uid, &uerr))) {
		mv_step_fail("no user name for the job's uid %u (getpwuid_r: "
			     "%s)", (unsigned)uid,
			     uerr ? strerror(uerr) : "no such user");
		goto out;
	}

	mv_argv_step(&a, "prepare");
	mv_argv_add(&a, "--uid");
	mv_argv_addf(&a, "%u", (unsigned)uid);
	mv_argv_add(&a, "--gid");
	mv_argv_addf(&a, "%u", (unsigned)gid);
	mv_argv_add(&a, "--groups");
	mv_argv_add(&a, groups);
	mv_argv_add(&a, "--user");
	mv_argv_add(&a, user);
	mv_argv_add(&a, "--image");
	mv_argv_add(&a, mv.opt.image);
	mv_argv_add(&a, "--cores");
	mv_argv_add(&a, cores ? cores : "");
	mv_argv_add(&a, "--mem-mb");
	mv_argv_addf(&a, "%llu", (unsigned long long)mem);
	if (mem_node[0]) {
		mv_argv_add(&a, "--mem-per-node");
		mv_argv_add(&a, mem_node);
	}
	if (mem_cpu[0]) {
		mv_argv_add(&a, "--mem-per-cpu");
		mv_argv_add(&a, mem_cpu);
	}
	mv_argv_add(&a, "--gpus");
	mv_argv_add(&a, gpus);
	mv_argv_add(&a, "--tasks");
	mv_argv_addf(&a, "%u", s->ntasks);
	if (cwd[0]) {
		mv_argv_add(&a, "--cwd");
		mv_argv_add(&a, cwd);
	}
	/* The step's nodes, for its network (hostlist, as Slurm writes it). */
	if (mv_getenv(sp, "SLURM_STEP_NODELIST", nodes, sizeof(nodes)) < 0)
		goto out;
	if (nodes[0]) {
		uint32_t nnodes = 0, nodeid = 0;

		mv_argv_add(&a, "--nodes");
		mv_argv_add(&a, nodes);
		/* slurmstepd's own view, which the job's environment cannot
		 * change: the launcher checks the list against it. */
		if (spank_get_item(sp, S_JOB_NNODES, &nnodes) == ESPANK_SUCCESS &&
		    spank_get_item(sp, S_JOB_NODEID, &nodeid) == ESPANK_SUCCESS &&
		    nnodes > 0) {
			mv_argv_add(&a, "--nnodes");
			mv_argv_addf(&a, "%u", nnodes);
			mv_argv_add(&a, "--node-index");
			mv_argv_addf(&a, "%u", nodeid);
		}
	}
	/* slurmstepd's slurm.conf, for the launcher's scontrol (node
	 * addresses of the step network); the launcher runs with a clean
	 * environment. */
	if ((conf = getenv("SLURM_CONF")) && conf[0]) {
		mv_argv_add(&a, "--slurm-conf");
		mv_argv_add(&a, conf);
	}
	mv_argv_options(&a);
	/* Environment fallback of --microvm-mounts (the job's environment). */
	if (!mv.opt.mounts &&
	    spank_getenv(sp, "SLURM_MICROVM_MOUNTS", menv, sizeof(menv)) ==
		    ESPANK_SUCCESS && menv[0]) {
		mv_argv_add(&a, "--mounts-env");
		mv_argv_add(&a, menv);
	}

	s->prepared = 1;
	if (mv_run("prepare", &a, mv_clean_env, MV_OUTPUT_LOG,
		   mv.cfg.timeout_s, &why) < 0) {
		mv_step_fail("cannot prepare the microVM for --microvm=%s: %s",
			     mv.opt.image, why ? why : "see the slurmd log");
		mv_remote_stop("cleanup after a failed prepare");
	} else {
		s->prepare_ok = 1;
	}
out:
	mv_argv_free(&a);
	free(why);
	free(user);
	free(groups);
	return 0;
}

/*
 * slurmstepd, root, after the tasks were forked (they wait for slurmstepd
 * before exec): local task 0 starts the sandbox supervisor, detached.
 */
int mv_remote_task_post_fork(spank_t sp)
{
	struct mv_step *s = &mv.step;
	struct mv_argv a = { 0 };
	int task = -1, rc;

	if (!s->active || !s->prepare_ok)
		return 0;
	if (spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS) {
		mv_error("step %u.%u: task_post_fork: cannot read the local "
			 "task id", s->job, s->step);
		return -1;
	}
	if (task != 0)
		return 0;

	mv_argv_step(&a, "start");
	rc = mv_spawn_detached("start", &a, mv_clean_env, mv.cfg.timeout_s);
	mv_argv_free(&a);
	if (rc < 0)
		mv_error("step %u.%u: cannot start the sandbox supervisor",
			 s->job, s->step);
	return rc;
}

/*
 * The task, as the user, right before exec: the task's argv becomes the
 * exec entry's. Slurm then still applies rlimits, TMPDIR and the task
 * prolog, and resolves nothing (the entry path is absolute).
 */
int mv_remote_task_init(spank_t sp)
{
	struct mv_step *s = &mv.step;
	char state[4096];
	char **argv = NULL;
	int argc = 0, n;
	spank_err_t err;

	if (!s->active)
		return 0;
	if ((err = spank_get_item(sp, S_JOB_ARGV, &argc, &argv)) !=
	    ESPANK_SUCCESS || argc < 1 || !argv || !argv[0]) {
		mv_error("step %u.%u: the task has no command (S_JOB_ARGV: %s)",
			 s->job, s->step, spank_strerror(err));
		return -1;
	}
	if (s->multi_prog || mv_is_multi_prog_data(argc, argv)) {
		mv_error(MV_MULTI_PROG_MSG);
		return -1;
	}
	if (!s->prepare_ok) {
		mv_error("step %u.%u: task refused: %s", s->job, s->step,
			 s->failure ? s->failure
				    : "the microVM was not prepared (see the "
				      "slurmd log)");
		return -1;
	}

	/* The launcher finds the state under microvm.toml's runtime_dir. */
	n = snprintf(state, sizeof(state), "%u.%u.%u%s%s", s->job, s->step,
		     s->restart, s->node[0] ? "." : "", s->node);
	if (n < 0 || (size_t)n >= sizeof(state))
		return -1;
	if ((err = spank_setenv(sp, "SLURM_MICROVM_ARGV0", argv[0], 1)) !=
	    ESPANK_SUCCESS ||
	    (err = spank_setenv(sp, "SLURM_MICROVM_STEP", state, 1)) !=
	    ESPANK_SUCCESS ||
	    (err = spank_setenv(sp, "SLURM_MICROVM_CONFIG", mv.cfg.config,
				1)) != ESPANK_SUCCESS) {
		mv_error("step %u.%u: cannot set the task environment: %s",
			 s->job, s->step, spank_strerror(err));
		return -1;
	}

#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(23, 11, 0)
	{
		const char *prefix[] = { mv.cfg.launcher, "exec", "--" };

		err = spank_prepend_task_argv(sp, 3, prefix);
		if (err != ESPANK_SUCCESS) {
			mv_error("step %u.%u: spank_prepend_task_argv: %s",
				 s->job, s->step, spank_strerror(err));
			return -1;
		}
	}
#else
	{
		/*
		 * S_JOB_ARGV is the task's own argv (slurmstepd_job.c sets
		 * task->argv = job->argv), in this forked task only. The old
		 * argv[0] belongs to Slurm's allocator: left alone, exec
		 * follows.
		 */
		char *entry = strdup(mv.cfg.exec);

		if (!entry) {
			mv_error("step %u.%u: out of memory", s->job, s->step);
			return -1;
		}
		argv[0] = entry;
	}
#endif
	/*
	 * The exec entry catches the signals it forwards once its Go code
	 * runs; the Go runtime drops a SIGUSR1, SIGUSR2 or SIGALRM that comes
	 * before (scancel -s USR1 right after the step starts). Blocked here,
	 * the mask survives exec and the signal stays pending until the
	 * entry's signal.Notify unblocks it. (Go unblocks SIGHUP, SIGINT and
	 * SIGTERM at start whatever the mask: those end an entry that has not
	 * caught them yet, which ends the step, as they would on the host.)
	 */
	{
		sigset_t set;

		sigemptyset(&set);
		sigaddset(&set, SIGUSR1);
		sigaddset(&set, SIGUSR2);
		sigaddset(&set, SIGALRM);
		if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
			mv_error("step %u.%u: block early signals: %m", s->job,
				 s->step);
	}
	mv_debug("step %u.%u: task runs through the exec entry (%s)", s->job,
		 s->step, state);
	return 0;
}

/*
 * slurmstepd, root, once per exited task: stop after the last one (a failed
 * prepare was already cleaned up; the exit backstop still runs).
 */
int mv_remote_task_exit(spank_t sp)
{
	struct mv_step *s = &mv.step;
	int task = -1;

	if (!s->active || !s->prepare_ok)
		return 0;
	if (spank_get_item(sp, S_TASK_ID, &task) == ESPANK_SUCCESS &&
	    task >= 0 && (uint32_t)task < s->ntasks && s->exited) {
		if (s->exited[task])
			return 0; /* the same task twice: count it once */
		s->exited[task] = 1;
	}
	s->nexited++;
	if (s->stopped || s->nexited < s->ntasks)
		return 0;
	s->stopped = 1;
	return mv_remote_stop("the last local task exited");
}

/* slurmstepd, root, step teardown: stop again (idempotent) as a backstop. */
int mv_remote_exit(spank_t sp)
{
	(void)sp;
	if (!mv.step.active || !mv.step.prepared)
		return 0;
	return mv_remote_stop("step exit backstop");
}
