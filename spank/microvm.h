/*
 * microvm.h - internal declarations of the slurm-microvm SPANK plugin.
 *
 * The plugin is thin (like pyxis): it registers and syntax-checks options,
 * reads what Slurm knows about the step, and hands everything to the Go
 * launcher (`slurm-microvm`, see cmd/slurm-microvm). It never decides policy.
 *
 * Files:
 *   microvm.c    SPANK_PLUGIN and the slurm_spank_* entry points: a dispatch
 *                on spank_context() into the files below
 *   args.c       plugstack.conf arguments and the --microvm* options
 *   local.c      srun/sbatch/salloc: `slurm-microvm validate`, --multi-prog
 *   remote.c     slurmstepd: prepare, detached start, argv swap, stop
 *   jobscript.c  job epilog: `slurm-microvm gc`
 *   spawn.c      fork/exec without a shell: synchronous with a timeout, or
 *                detached (double fork, setsid, every fd closed)
 *
 * Only slurm_spank_* and the SPANK_PLUGIN data symbols leave the shared
 * object (microvm.map); everything declared here is internal.
 */
#ifndef MICROVM_H
#define MICROVM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <slurm/spank.h>

/* Every message carries this prefix so admins can grep slurmd.log. */
#define MV_PREFIX "microvm: "
#define mv_error(...) slurm_error(MV_PREFIX __VA_ARGS__)
#define mv_info(...) slurm_info(MV_PREFIX __VA_ARGS__)
#define mv_debug(...) slurm_debug(MV_PREFIX __VA_ARGS__)

/* Defaults of the plugstack.conf arguments. */
#define MV_DEFAULT_LAUNCHER "/usr/local/bin/slurm-microvm"
#define MV_EXEC_SUFFIX "-exec"
#define MV_DEFAULT_CONFIG "/etc/slurm/microvm.toml"
#define MV_DEFAULT_TIMEOUT_S 300u
#define MV_MAX_TIMEOUT_S 86400u

/* Longest option value accepted (bytes); longer input is a user error. */
#define MV_MAX_OPTARG 4096

/*
 * Plugin configuration from plugstack.conf, e.g.
 *   required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_microvm.so \
 *       launcher=/usr/local/bin/slurm-microvm config=/etc/slurm/microvm.toml
 * All paths are absolute. timeout_s bounds every synchronous launcher call.
 */
struct mv_config {
	int loaded;
	char *launcher; /* launcher=  the slurm-microvm binary            */
	char *exec;     /* exec=      exec entry, default launcher+"-exec" */
	char *config;   /* config=    microvm.toml passed as --config      */
	unsigned timeout_s; /* timeout= seconds per synchronous call       */
};

/* Values of the --microvm* options (copies owned by the plugin). */
struct mv_options {
	char *image;   /* --microvm=IMAGE          */
	char *mounts;  /* --microvm-mounts=SPEC    */
	char *workdir; /* --microvm-workdir=DIR    */
	char *mpi;     /* --microvm-mpi=MODE       */
	char *network; /* --microvm-network=MODE   */
	int debug;     /* --microvm-debug          */
	/* The SLURM_MICROVM_* variables mv_options_env took, ", "-joined. */
	char from_env[160];
};

/* What slurmstepd (remote context) knows about this step on this node. */
struct mv_step {
	uint32_t job, step, restart;
	char node[65];      /* SLURMD_NODENAME ("" when slurmstepd has none) */
	int active;         /* a --microvm step handed to the launcher     */
	int prepared;       /* `prepare` was run (stop/exit must tear down) */
	int prepare_ok;     /* ... and succeeded (start may follow)        */
	int multi_prog;     /* --multi-prog detected: tasks are refused    */
	char *failure;      /* why the step cannot run: tasks are refused  */
	uint32_t ntasks;    /* S_JOB_LOCAL_TASK_COUNT                      */
	uint32_t nexited;   /* distinct local tasks seen in task_exit      */
	unsigned char *exited; /* one flag per local task id               */
	int stopped;        /* `stop` already run after the last task      */
};

struct mv_state {
	struct mv_config cfg;
	struct mv_options opt;
	struct mv_step step;
};

/* The plugin's process-wide state (one plugin instance per process). */
extern struct mv_state mv;

/* microvm.c: frees and zeroes all state (slurm_spank_exit, test harness). */
void mv_state_reset(void);

/* args.c */
int mv_config_load(int ac, char **av);
int mv_options_register(spank_t sp);
int mv_is_multi_prog_data(int argc, char **argv);
/*
 * NULL when the options are consistent, else a malloc'ed message naming
 * the --microvm-* options given without --microvm=IMAGE and the fix.
 */
char *mv_options_orphan(void);
/*
 * Fills the options not given from SLURM_MICROVM_IMAGE, _WORKDIR, _MPI,
 * _NETWORK, _DEBUG (the last four only once there is an image): srun's
 * environment (getenv) in the local and allocator contexts, the step's
 * (spank_getenv) when remote. _MOUNTS is the launcher's (--mounts-env).
 * Returns -1, logged, for a value the option would refuse.
 */
int mv_options_env(spank_t sp, int remote);
struct mv_argv;
/* Adds [--debug] [--mounts M] [--workdir W] [--mpi X] from the options. */
void mv_argv_options(struct mv_argv *a);

/* The one message for a refused srun --multi-prog. */
#define MV_MULTI_PROG_MSG \
	"--multi-prog is not supported with --microvm yet: run one program " \
	"per step (srun --microvm=IMAGE PROGRAM ARGS), or start the " \
	"programs from a script inside the microVM"

/* local.c: srun, sbatch, salloc. */
int mv_local_init_post_opt(spank_t sp);
int mv_local_user_init(spank_t sp);

/* remote.c: slurmstepd. */
int mv_remote_init_post_opt(spank_t sp);
int mv_remote_task_post_fork(spank_t sp);
int mv_remote_task_init(spank_t sp);
int mv_remote_task_exit(spank_t sp);
int mv_remote_exit(spank_t sp);

/* jobscript.c: prolog/epilog context. */
int mv_job_epilog(spank_t sp);

/* spawn.c: an argv under construction, always NULL-terminated. */
struct mv_argv {
	char **v;
	size_t n, cap;
	int failed; /* an allocation failed: do not run */
};

void mv_argv_add(struct mv_argv *a, const char *s);
void mv_argv_addf(struct mv_argv *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void mv_argv_free(struct mv_argv *a);
/* launcher --config F <subcommand> */
void mv_argv_launcher(struct mv_argv *a, const char *subcommand);

enum mv_output {
	MV_OUTPUT_LOG,  /* stdout+stderr captured, logged with MV_PREFIX  */
	MV_OUTPUT_PASS, /* stderr inherited, stdout sent to stderr        */
};

/* The environment of launcher calls made as root from slurmstepd. */
extern char *const mv_clean_env[];

/*
 * Runs argv synchronously (fork, execve, waitpid; never a shell), stdin on
 * /dev/null, every fd >= 3 closed, signals reset. A call still running
 * after timeout_s seconds is killed (SIGKILL to its pid). Returns 0 when it
 * exited 0, -1 otherwise; failures are logged naming `what`. If why is not
 * NULL, a failure also stores there one malloc'ed line for the user: the
 * last line the launcher printed, else what happened to it.
 */
int mv_run(const char *what, const struct mv_argv *a, char *const envp[],
	   enum mv_output output, unsigned timeout_s, char **why);
/*
 * Starts argv detached: fork, setsid, fork; the intermediate child exits at
 * once and is reaped; the grandchild has stdio on /dev/null, no other fd,
 * cwd /, default signals, and execs argv. Returns 0 once execve succeeded
 * (seen through a close-on-exec pipe, waited for at most timeout_s).
 */
int mv_spawn_detached(const char *what, const struct mv_argv *a,
		      char *const envp[], unsigned timeout_s);

#endif /* !MICROVM_H */
