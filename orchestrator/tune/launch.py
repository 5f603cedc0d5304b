"""Tuner assembly: a campaign (or a lone trial) is one Tune experiment; each trial one placement group.

Resume is Tune's: running a campaign whose experiment directory exists restores it (`Tuner.restore`), finished
trials stay finished, errored and interrupted ones continue from their last checkpoint. A Tune snapshot torn by a
killed driver is set aside and the experiment starts afresh in the same directory: each trial then finds its own
newest checkpoint (orchestrator/trial/loop.py `_resume`), so nothing done is lost.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickletools
from contextlib import contextmanager
from pathlib import Path

import ray
from ray import tune

from orchestrator import imports_done
from orchestrator import storage as store
from orchestrator.campaign.schema import Campaign
from orchestrator.config.errors import UserError
from orchestrator.config.placement import bundles, tune_bundles
from orchestrator.config.pool_key import pool_groups
from orchestrator.config.trial import TrialConfig
from orchestrator.pool.lifecycle import running_pools
from orchestrator.preflight.checks import check_campaign_models, check_cluster, check_episodes
from orchestrator.tracking.mode import wandb_mode, with_wandb_mode
from orchestrator.trial.loop import run_trial
from orchestrator.tune.pending import PendingOnAutoscaling
from orchestrator.tune.same_config import config_change
from orchestrator.tune.scheduling import TuneScheduling, concurrency_limit, scheduling


def ensure_ray(min_cpus: float, num_gpus: float | None = None) -> None:
    """Connect to RAY_ADDRESS (or the job's cluster), else start a private local Ray sized for one trial
    (logical CPUs may exceed the cores: trials are IO/latency bound at the tiny scale)."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS") or os.environ.get("RAY_JOB_SUBMISSION_ID"):
        ray.init()
        return
    cpus = max(os.cpu_count() or 1, int(min_cpus + 0.999))
    ray.init(address="local", num_cpus=cpus, num_gpus=num_gpus, include_dashboard=False,
             runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                                       "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
                                       "TOKENIZERS_PARALLELISM": "false"}})


def _campaign_trial(config: dict, trials: dict[str, dict]) -> None:
    """The campaign's trainable: the param space holds only the trial name, the configs travel alongside."""
    run_trial(trials[config["trial"]])


def _factory(trials: dict[str, dict]):
    def resources(config: dict) -> tune.PlacementGroupFactory:
        return tune.PlacementGroupFactory(tune_bundles(TrialConfig.model_validate(trials[config["trial"]])),
                                          strategy="PACK")

    return resources


def _trainable(trials: dict[str, dict]):
    return tune.with_resources(tune.with_parameters(_campaign_trial, trials=trials), _factory(trials))


SNAPSHOT_FILES = ("experiment_state-", "basic-variant-state-")  # Tune's snapshot: trials (JSON), search state


def _whole(raw: bytes) -> bool:
    """Whole JSON (experiment_state) or a whole pickle stream (basic-variant-state: Tune pickles it despite its
    .json name; pickletools reads the opcodes up to STOP without running any)."""
    try:
        json.loads(raw)
        return True
    except ValueError:
        pass
    try:
        ops = list(pickletools.genops(raw))
    except Exception:  # truncated or not a pickle: genops raises ValueError, or anything a broken stream trips
        return False
    return bool(ops) and ops[-1][0].name == "STOP"


def _torn_snapshot(directory: str) -> str | None:
    """Why Tune could not restore the experiment in `directory` (the newest of its snapshot files is not whole:
    the driver was killed while Tune copied it to storage), or None. A torn file is moved aside (`.torn`) so
    that no later restore reads it."""
    import pyarrow.fs

    fs, path = store.filesystem(directory)
    listed = [i.base_name for i in fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))]
    for prefix in SNAPSHOT_FILES:
        names = sorted(n for n in listed if n.startswith(prefix) and n.endswith(".json"))
        if not names:
            continue
        newest = f"{path}/{names[-1]}"
        with fs.open_input_stream(newest) as f:
            raw = f.read()
        if not _whole(raw):
            fs.move(newest, newest + ".torn")
            return f"Tune's experiment snapshot {names[-1]} is torn ({len(raw)} bytes, not whole)"
    return None


def _tuner(name: str, storage: str, trials: dict[str, dict], plan: TuneScheduling, *, max_failures: int,
           keep: int, callbacks: list | None = None) -> tune.Tuner:
    """plan.search_alg: the campaign's searcher (lockstep / adaptive seeds, orchestrator/tune/scheduling.py) hands
    Tune the trial names instead of the grid."""
    scheduler, search_alg, max_concurrent = plan.scheduler, plan.search_alg, plan.max_concurrent
    directory = store.join(storage, name)
    trainable = _trainable(trials)
    param_space = {"trial": tune.grid_search(list(trials))} if search_alg is None else None
    if tune.Tuner.can_restore(directory):
        torn = _torn_snapshot(directory)
        if torn is None:
            # param_space again: were Tune's restore to fail anyway, its fallback fresh run has the right trials
            return tune.Tuner.restore(directory, trainable=trainable, param_space=param_space,
                                      resume_unfinished=True, resume_errored=True)
        print(f"{torn}: starting Tune afresh in {directory}; every trial resumes from its newest checkpoint",
              flush=True)
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent, scheduler=scheduler,
                                    search_alg=search_alg, num_samples=len(trials) if search_alg else 1,
                                    trial_name_creator=lambda t: t.config["trial"],
                                    trial_dirname_creator=lambda t: t.config["trial"]),
        run_config=tune.RunConfig(
            name=name, storage_path=storage,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=keep),
            failure_config=tune.FailureConfig(max_failures=max_failures),
            callbacks=callbacks,
        ),
    )


def check_same_campaign(campaign: Campaign) -> None:
    """A resumed experiment must be the campaign that started it: same trials, same configs (fields the code
    gained since, at their defaults, excepted: tune/same_config.py)."""
    text = store.read_text(store.join(campaign.directory, store.CAMPAIGN_FILE))
    if text is None:
        return
    before = {t["name"]: t["config"] for t in json.loads(text)["trials"]}
    now = {t.name: t.config for t in campaign.trials}
    changed = sorted(set(before) ^ set(now))
    why = {} if changed else {n: config_change(before[n], now[n]) for n in sorted(now)}
    changed = changed or [n for n, w in why.items() if w]
    if changed:
        first = f"; {changed[0]}: {why[changed[0]]}" if why.get(changed[0]) else ""
        raise UserError(f"{campaign.source}: campaign '{campaign.config.name}' in {campaign.directory} was started "
                        f"with different trials ({', '.join(changed[:3])}{'...' if len(changed) > 3 else ''} "
                        f"differ{first}); restore the file, or change name/storage to start a new campaign")


def write_campaign_file(campaign: Campaign) -> None:
    store.write_text(store.join(campaign.directory, store.CAMPAIGN_FILE), json.dumps({
        "name": campaign.config.name, "description": campaign.config.description, "source": campaign.source,
        "campaign_id": campaign.directory, "trials": [t.row() for t in campaign.trials],
    }, indent=1))


@contextmanager
def driver_lock(campaign: Campaign):
    """One driver per campaign: a second `run` of a campaign that is running stops with exit code 2.

    An OS lock, so a SIGKILLed driver releases it. Only for local/shared paths (URIs: Jobs' submit check)."""
    if store.is_uri(campaign.directory):
        yield
        return
    path = Path(campaign.directory) / store.LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise UserError(f"{campaign.source}: campaign '{campaign.config.name}' is already running "
                            f"(driver {f.read().strip() or 'unknown'}); wait for it or stop it") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {os.uname().nodename}")
        f.flush()
        yield


def campaign_cpus(campaign: Campaign) -> float:
    """CPUs a local Ray needs for the campaign: its largest trial's; on a shared base, every pool's engines and
    learner and a driver per trial that may run at once (orchestrator/tune/scheduling.py:concurrency_limit)."""
    pools = pool_groups(t.trial for t in campaign.trials)
    if not pools:
        return max(sum(b.get("CPU", 0) for b in bundles(t.trial)) for t in campaign.trials)
    first = campaign.trials[0].trial
    pool_cpus = sum(sum(b.get("CPU", 0) for b in bundles(group[0])[1:]) for group in pools.values())
    return pool_cpus + (concurrency_limit(campaign) or len(campaign.trials)) * first.resources.driver_cpus


def shaped(campaign: Campaign) -> Campaign:
    """The campaign with `shape: auto` resolved for the connected cluster (what it can grow to), a resumed one with
    the shape it started with (campaign.json), and its written shape checked against the cluster
    (orchestrator/preflight/shape_choice.py; one line, exit 2, when it cannot hold it)."""
    from orchestrator.campaign.shared import check_shared_base
    from orchestrator.preflight.cluster import capacity
    from orchestrator.preflight.cost_model import device_kind
    from orchestrator.preflight.plan import Cluster
    from orchestrator.preflight.shape_choice import check_shape, resolve_shape

    first = campaign.trials[0].trial.resources.shared_base
    if first is None:
        return campaign
    cap = capacity()
    cluster = Cluster(cap.total("GPU"), cap.total("CPU"), f"the Ray cluster ({cap.describe()})")
    text = store.read_text(store.join(campaign.directory, store.CAMPAIGN_FILE))
    started = {t["name"]: t["config"] for t in json.loads(text)["trials"]} if text else None
    resolved = resolve_shape(campaign, cluster, device_kind(campaign.trials[0].trial.resources.accelerator_type),
                             started=started)
    if resolved is not campaign:
        shape = resolved.trials[0].trial.resources.shared_base
        print(f"shape: auto -> {shape.engines} engine(s), {shape.learners} learner(s), {shape.slots} slot(s) on "
              f"{cluster.gpus:g} GPUs, {cluster.cpus:g} CPUs" + (" (as the campaign started)" if started else ""),
              flush=True)
        check_shared_base(resolved.config, resolved.trials, resolved.source)
    check_shape(resolved, cluster)
    return resolved


def events_writer(directory: str):
    """`record(event)`: one line of the campaign's events.jsonl in `directory`."""
    return lambda event: store.append_line(store.join(directory, store.EVENTS_FILE), event)


def run_campaign(campaign: Campaign) -> int:
    """Run (or resume) every trial of the campaign; returns the number of trials that did not finish."""
    imports_done()  # a driver that may run for days collects at the default thresholds: workers/startup.py
    campaign = with_wandb_mode(campaign, wandb_mode())  # $WANDB_MODE / --wandb-mode over the file
    ensure_ray(campaign_cpus(campaign))
    campaign = shaped(campaign)  # resources.shared_base.shape: auto -> the shape `plan` picks for this cluster
    check_cluster(campaign)
    check_campaign_models(campaign)
    check_episodes(campaign.source, [(t.name, t.trial) for t in campaign.trials])
    from orchestrator.preflight.shape_choice import run_paragraph

    print(run_paragraph(campaign), flush=True)
    with driver_lock(campaign):
        check_same_campaign(campaign)
        resumed = tune.Tuner.can_restore(campaign.directory)
        write_campaign_file(campaign)
        cfg = campaign.config
        keep = max(t.trial.checkpoint.keep for t in campaign.trials)
        print(f"{'resuming' if resumed else 'starting'} campaign {cfg.name}: {len(campaign.trials)} trials -> "
              f"{campaign.directory}", flush=True)
        from orchestrator.tracking.dashboard import save_at_start  # wandb-workspaces loads only here

        save_at_start(campaign)  # online: the campaign's W&B workspace, saved now
        plan = scheduling(campaign)
        callbacks = [PendingOnAutoscaling(campaign.directory), *([plan.owner] if plan.owner else [])]
        tuner = _tuner(cfg.name, campaign.storage, {t.name: t.config for t in campaign.trials}, plan,
                       max_failures=cfg.max_failures, keep=keep, callbacks=callbacks)
        with running_pools([t.trial for t in campaign.trials],  # resources.shared_base: a pool per model
                           record=events_writer(campaign.directory)):  # the pool supervisor's kills and restarts
            results = tuner.fit()
    failed = [r for r in results if r.error]
    ended = "stopped by the budget at a round boundary" if getattr(plan.scheduler, "stopped", False) else "finished"
    print(f"campaign {cfg.name}: {len(results) - len(failed)}/{len(results)} trials {ended}; "
          f"results in {campaign.directory}")
    if cfg.wandb.mode == "offline":
        print(f"W&B offline runs: {cfg.wandb.dir or campaign.directory}/wandb (upload: wandb sync "
              f"{cfg.wandb.dir or campaign.directory}/wandb/offline-run-*; then the campaign's W&B workspace: "
              f"python -m orchestrator dashboard {campaign.source})")
    for r in failed:
        print(f"  failed: {r.metrics.get('trial', '?') if r.metrics else '?'}: {failure_line(r.error)}")
    return len(failed)


# ------------------------------------------------------------------------------------------- a lone trial
def failure_line(err: BaseException) -> str:
    """One line for a failed trial: the error raised inside it (Ray wraps it; `.cause` is the original), whole
    when it is a checkpoint that cannot be used (the message names the file), else its type and first line."""
    from orchestrator.trial.artifacts.restore import CheckpointError

    cause = getattr(err, "cause", None) or err
    if isinstance(cause, CheckpointError):
        return str(cause)
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"


def run_single_trial(cfg: TrialConfig, storage: Path, max_failures: int = 0):
    """Run one trial to completion as a one-trial experiment; returns the Tune Result (None if it errored)."""
    sb = cfg.resources.shared_base
    if sb is not None and sb.shape == "auto":
        raise UserError("resources.shared_base.shape: auto shapes a campaign's pool for its cluster (`python -m "
                        "orchestrator run CAMPAIGN`, `plan` shows the pick); a lone trial runs its pool as written: "
                        "set learners and engines instead")
    storage.mkdir(parents=True, exist_ok=True)
    if cfg.output_dir is None:
        cfg = cfg.model_copy(update={"output_dir": str(storage / cfg.name / "trial")})
    saved = storage / cfg.name / store.TRIAL_CONFIG_FILE
    now = cfg.model_dump(mode="json")
    why = config_change(json.loads(saved.read_text()), now) if saved.is_file() else None
    if why:
        raise UserError(f"trial '{cfg.name}' in {storage / cfg.name} was started with a different config ({why}); "
                        "use another name or --storage for a new trial, or restore the config to resume it")
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(now, indent=1))
    ensure_ray(sum(b.get("CPU", 0) for b in bundles(cfg)))
    owner = None
    if cfg.resources.shared_base is not None:  # the driver gives the slot back whatever the trial's process did
        from orchestrator.config.pool_key import pool_id
        from orchestrator.tune.slot_owner import SlotOwner

        owner = SlotOwner({cfg.name: pool_id(cfg)}, str(storage / cfg.name))
    tuner = _tuner(cfg.name, str(storage), {cfg.name: cfg.model_dump(mode="json")}, TuneScheduling(),
                   max_failures=max_failures, keep=cfg.checkpoint.keep, callbacks=[owner] if owner else None)
    with running_pools([cfg], record=events_writer(str(storage / cfg.name))):  # shared_base: a pool of its own
        result = tuner.fit()[0]
    if result.error:
        print(f"trial {cfg.name} failed: {failure_line(result.error)}")
        return None
    print(f"trial {cfg.name} finished; metrics in {cfg.output_dir}/metrics.jsonl")
    return result
