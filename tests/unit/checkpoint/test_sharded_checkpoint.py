"""Sharded learner checkpoints (workers/checkpoint/sharded.py) with real torch.distributed: 2 gloo ranks FSDP2-shard
a tiny HF Llama, take AdamW steps on different data and save; the checkpoint restores on 1 plain process and on 2
ranks, a LoRA variant saves only adapters, and crafted or damaged files are refused.

One spawned 2-rank run does every distributed step (spawn startup dominates); its ranks write their files, the
gathered reference state and their own checks under a temp directory, which the tests below read.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.distributed.tensor import DTensor

from workers.checkpoint.blob import CorruptCheckpoint, UnsafeCheckpoint
from workers.checkpoint.shard_files import METADATA_FILE, read_metadata
from workers.checkpoint.sharded import PARAM_GROUPS_FILE, load_shards, save_shards
from workers.models.loading import TINY_VOCAB, build_tiny_model

VOCAB = len(TINY_VOCAB)  # training ids are drawn below it
SAVED_LR, FRESH_LR = 0.0123, 0.5  # the saved optimizer's lr (as a scheduler leaves it) and a fresh one's


# -- building blocks shared by the ranks and the single process -----------------------------------------------
def _policy(model_dir: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _value_head(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(128, 1)


def _lora(model_dir: str, seed: int) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)  # lora_A's init: a fresh copy differs from the saved one
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    return get_peft_model(_policy(model_dir), cfg)


def _shard(model: nn.Module, layers: nn.ModuleList, mesh) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _train(model: nn.Module, optim: torch.optim.Optimizer, seed: int, steps: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(4, VOCAB, (2, 8), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        optim.step()
        optim.zero_grad()
    for group in optim.param_groups:
        group["lr"] = SAVED_LR


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor's shards gathered (collective on every rank), a plain tensor as is."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _snapshot(model: nn.Module, optim: torch.optim.Optimizer | None, trainable_only: bool = False) -> dict:
    """Independent reference: {"param.<name>": tensor, "optim.<name>.<key>": tensor, "lr": [...]} read straight
    from the parameters and `optim.state` (DTensors gathered), not through DCP or get_state_dict."""
    out: dict = {}
    names = {}
    for name, p in model.named_parameters():
        names[p] = name
        if p.requires_grad or not trainable_only:
            out[f"param.{name}"] = _full(p)
    if optim is not None:
        for p, st in optim.state.items():
            for key, value in st.items():
                out[f"optim.{names[p]}.{key}"] = _full(value)
        out["lr"] = [g["lr"] for g in optim.param_groups]
    return out


def _parts_snapshot(policy: nn.Module, optim: torch.optim.Optimizer, head: nn.Module) -> dict:
    return {**_snapshot(policy, optim), **{f"head.{k}": v for k, v in _snapshot(head, None).items()}}


def _mismatches(got: dict, want: dict) -> list[str]:
    bad = sorted(set(got) ^ set(want))
    for key in set(got) & set(want):
        same = got[key] == want[key] if key == "lr" else torch.equal(got[key], want[key])
        if not same:
            bad.append(key)
    return sorted(bad)


def _write(files: dict[str, bytes], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)


def _merge(rank_dirs: list[Path], out: Path) -> dict[str, bytes]:
    """What the trial driver does: every rank's files into one directory (no name may repeat), read back."""
    out.mkdir(parents=True, exist_ok=True)
    for d in rank_dirs:
        for f in d.iterdir():
            assert not (out / f.name).exists(), f"two ranks wrote {f.name}"
            (out / f.name).write_bytes(f.read_bytes())
    return {f.name: f.read_bytes() for f in out.iterdir()}


class _Reads:
    """A checkpoint's files that counts the bytes read from each (a group's rank fetches what it reads)."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.bytes_read = files, dict.fromkeys(files, 0)

    def __contains__(self, name):
        return name in self.files

    def size(self, name):
        return len(self.files[name])

    def read(self, name, start=0, end=None):
        data = self.files[name][start:end]
        self.bytes_read[name] += len(data)
        return data


# -- the 2-rank run -----------------------------------------------------------------------------------------
def _rank_main(rank: int, tmp: str, model_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    tmp_path = Path(tmp)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    checks: dict[str, object] = {}

    def fresh_full():
        policy, head = _policy(model_dir), _value_head(seed=456)
        _shard(policy, policy.model.layers, mesh)
        _shard(head, [], mesh)
        optim = torch.optim.AdamW(policy.parameters(), lr=FRESH_LR)
        return policy, optim, head

    # full fine-tuning: policy (+ AdamW) and a value head without an optimizer, sharded over 2 ranks
    policy, head = _policy(model_dir), _value_head(seed=123)
    _shard(policy, policy.model.layers, mesh)
    _shard(head, [], mesh)
    optim = torch.optim.AdamW(policy.parameters(), lr=1e-2, weight_decay=0.1)
    _train(policy, optim, seed=rank, steps=2)  # different data per rank; step = 2 differs from a fresh init's 1
    ref = _parts_snapshot(policy, optim, head)
    files = save_shards({"policy": (policy, optim), "value_head": (head, None)}, trainable_only=False)
    _write(files, tmp_path / "full" / f"rank{rank}")
    if rank == 0:
        torch.save(ref, tmp_path / "full_ref.pt")

    # (b) restore on 2 ranks from the merged files (every rank gets all of them)
    gathered: list = [None, None]
    dist.all_gather_object(gathered, files)
    checks["disjoint"] = not set(gathered[0]) & set(gathered[1])
    merged = _Reads({**gathered[0], **gathered[1]})
    policy2, optim2, head2 = fresh_full()
    load_shards(merged, {"policy": (policy2, optim2), "value_head": (head2, None)}, trainable_only=False,
                source="ckpt-2")
    got = _parts_snapshot(policy2, optim2, head2)
    checks["two_from_two"] = _mismatches(got, ref)
    checks["read_two_from_two"] = {name: (n, len(merged.files[name])) for name, n in merged.bytes_read.items()}

    # 1 -> 2: the single process's checkpoint restored on 2 ranks
    single = {f.name: f.read_bytes() for f in (tmp_path / "single").iterdir()}
    policy3, optim3, head3 = fresh_full()
    load_shards(single, {"policy": (policy3, optim3), "value_head": (head3, None)}, trainable_only=False,
                source="ckpt-1")
    got = _parts_snapshot(policy3, optim3, head3)
    checks["two_from_one"] = _mismatches(got, torch.load(tmp_path / "single_ref.pt"))

    # (c) LoRA: only the adapters (requires_grad) and their optimizer state are saved
    lora = _lora(model_dir, seed=7)
    _shard(lora, lora.base_model.model.model.layers, mesh)
    lora_optim = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    _train(lora, lora_optim, seed=10 + rank, steps=2)
    lora_ref = _snapshot(lora, lora_optim, trainable_only=True)
    _write(save_shards({"policy": (lora, lora_optim)}, trainable_only=True), tmp_path / "lora" / f"rank{rank}")
    reads: list = [None, None]
    dist.all_gather_object(reads, checks["read_two_from_two"])
    checks["read_two_from_two"], checks["read_two_from_two_rank1"] = reads
    if rank == 0:
        torch.save(lora_ref, tmp_path / "lora_ref.pt")
        (tmp_path / "checks.json").write_text(json.dumps(checks))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("dcp")
    model_dir = str(build_tiny_model(tmp / "tiny", seed=0))
    # a 1-process checkpoint first, for the 2 ranks to restore (1 -> 2)
    policy, head = _policy(model_dir), _value_head(seed=321)
    optim = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    _train(policy, optim, seed=99, steps=3)
    torch.save(_parts_snapshot(policy, optim, head), tmp / "single_ref.pt")
    _write(save_shards({"policy": (policy, optim), "value_head": (head, None)}, trainable_only=False), tmp / "single")

    mp.spawn(_rank_main, args=(str(tmp), model_dir), nprocs=2, join=True)
    return {"tmp": tmp, "model_dir": model_dir, "checks": json.loads((tmp / "checks.json").read_text()),
            "full": _merge([tmp / "full" / "rank0", tmp / "full" / "rank1"], tmp / "full_merged"),
            "lora": _merge([tmp / "lora" / "rank0", tmp / "lora" / "rank1"], tmp / "lora_merged")}


# -- tests ----------------------------------------------------------------------------------------------------
def test_each_rank_writes_its_own_files_and_the_metadata_names_them(run):
    tmp = run["tmp"]
    names = [{f.name for f in (tmp / "full" / f"rank{r}").iterdir()} for r in (0, 1)]
    assert run["checks"]["disjoint"] and not names[0] & names[1]
    assert {METADATA_FILE, PARAM_GROUPS_FILE} <= names[0]
    assert all(n.startswith("__1_") for n in names[1]), names[1]  # rank 1: shards only
    used = {info.relative_path for info in read_metadata(run["full"], "ckpt").storage_data.values()}
    assert used == {n for n in names[0] | names[1] if n.endswith(".distcp")}
    assert all("/" not in n for n in used)


def test_two_rank_checkpoint_restores_on_one_plain_process_exactly(run):
    ref = torch.load(run["tmp"] / "full_ref.pt")
    policy, head = _policy(run["model_dir"]), _value_head(seed=456)
    optim = torch.optim.AdamW(policy.parameters(), lr=FRESH_LR)
    assert _mismatches({"param." + n: p.detach() for n, p in policy.named_parameters()},
                       {k: v for k, v in ref.items() if k.startswith("param.")})  # the fresh model differs
    load_shards(run["full"], {"policy": (policy, optim), "value_head": (head, None)}, trainable_only=False,
                source="ckpt")
    got = _parts_snapshot(policy, optim, head)
    assert _mismatches(got, ref) == []
    assert {k.rsplit(".", 1)[1] for k in ref if k.startswith("optim.")} == {"exp_avg", "exp_avg_sq", "step"}
    assert all(float(v) == 2 for k, v in got.items() if k.endswith(".step"))
    assert got["lr"] == [SAVED_LR]


def test_restores_on_two_ranks_from_two_and_from_one(run):
    assert run["checks"]["two_from_two"] == []


def test_a_group_restoring_as_it_saved_reads_its_own_share(run):
    """Each rank of a 2-rank group restoring the 2-rank checkpoint reads the metadata, the optimizers' groups, the
    whole shard file its own rank wrote and, of the other rank's, only the replicated scalars DCP saved there once
    (AdamW's step counts): a few hundred bytes, where the file is half the checkpoint (at 3B in full mode,
    ~37 GB)."""
    md = read_metadata(run["full"], "ckpt")
    for rank, reads in enumerate((run["checks"]["read_two_from_two"], run["checks"]["read_two_from_two_rank1"])):
        own, other = reads[f"__{rank}_0.distcp"], reads[f"__{1 - rank}_0.distcp"]
        assert own[0] > max(0.99 * own[1], 100_000), reads  # its own file (bar a few small records)
        steps = sum(info.length for index, info in md.storage_data.items()
                    if info.relative_path == f"__{1 - rank}_0.distcp" and index.fqn.endswith(".step"))
        assert other[0] == steps < 0.05 * other[1], reads  # the step counts only (~1 KB a record)
        assert reads[METADATA_FILE][0] == reads[METADATA_FILE][1]
    assert run["checks"]["two_from_one"] == []


def test_lora_saves_only_adapters_and_round_trips(run):
    keys = set(read_metadata(run["lora"], "lora").state_dict_metadata)
    ref = torch.load(run["tmp"] / "lora_ref.pt")
    adapters = [k[len("param."):] for k in ref if k.startswith("param.")]
    assert adapters and all("lora_" in a for a in adapters)
    assert keys == {f"policy.model.{a}" for a in adapters} | {
        f"policy.optim.{a}.{s}" for a in adapters for s in ("exp_avg", "exp_avg_sq", "step")}

    lora = _lora(run["model_dir"], seed=8)
    base = {n: p.detach().clone() for n, p in lora.named_parameters() if not p.requires_grad}
    optim = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=FRESH_LR)
    load_shards(run["lora"], {"policy": (lora, optim)}, trainable_only=True, source="lora")
    assert _mismatches(_snapshot(lora, optim, trainable_only=True), ref) == []
    assert all(torch.equal(p, base[n]) for n, p in lora.named_parameters() if not p.requires_grad)


@pytest.fixture(scope="module")
def plain(run) -> dict:
    policy = _policy(run["model_dir"])
    return {"policy": (policy, torch.optim.AdamW(policy.parameters())), "value_head": (_value_head(1), None)}


class _System:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __reduce__(self):
        return (eval, ("1+1",))


@pytest.mark.parametrize("payload", ["system", "eval", "torch_load"])
def test_crafted_metadata_is_refused_without_running_it(run, plain, tmp_path, payload):
    marker = tmp_path / "ran"
    crafted = {"system": _System(marker), "eval": _Eval(), "torch_load": torch.load}[payload]
    files = {**run["full"], METADATA_FILE: pickle.dumps(crafted)}
    with pytest.raises(UnsafeCheckpoint) as err:
        load_shards(files, plain, trainable_only=False, source="s3://bucket/ckpt_7")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("s3://bucket/ckpt_7/.metadata: refused")
    assert {"system": "system", "eval": "builtins.eval", "torch_load": "torch.serialization.load"}[payload] in msg
    assert not marker.exists()


def _with_metadata(files: dict[str, bytes], edit) -> dict[str, bytes]:
    md = pickle.loads(files[METADATA_FILE])  # the test's own, trusted file
    edit(md)
    return {**files, METADATA_FILE: pickle.dumps(md)}


def test_pickled_object_entry_and_foreign_paths_are_refused(run, plain):
    key = "policy.model.model.norm.weight"
    as_bytes = _with_metadata(run["full"], lambda md: md.state_dict_metadata.__setitem__(key, BytesStorageMetadata()))
    with pytest.raises(UnsafeCheckpoint, match=f"{key} is a pickled Python object"):
        load_shards(as_bytes, plain, trainable_only=False, source="ckpt")

    def escape(md):
        index = next(iter(md.storage_data))
        md.storage_data[index] = _StorageInfo("../../etc/passwd", 0, 10)
    with pytest.raises(UnsafeCheckpoint, match="not a file of the checkpoint"):
        load_shards(_with_metadata(run["full"], escape), plain, trainable_only=False, source="ckpt")


def test_shard_that_is_not_weights_only_is_refused(run, plain, tmp_path):
    marker = tmp_path / "ran"
    buf = io.BytesIO()
    torch.save(_System(marker), buf)
    evil = buf.getvalue()

    def point_at_evil(md):
        index = next(i for i in md.storage_data if i.fqn == "policy.model.model.norm.weight")
        md.storage_data[index] = _StorageInfo("__7_0.distcp", 0, len(evil))
    files = {**_with_metadata(run["full"], point_at_evil), "__7_0.distcp": evil}
    with pytest.raises(UnsafeCheckpoint, match="system") as err:
        load_shards(files, plain, trainable_only=False, source="ckpt")
    assert "\n" not in str(err.value) and str(err.value).startswith("ckpt/__7_0.distcp: refused")
    assert not marker.exists()


def test_truncated_metadata_is_corrupt(run, plain):
    files = {**run["full"], METADATA_FILE: run["full"][METADATA_FILE][:200]}
    with pytest.raises(CorruptCheckpoint, match=r"^ckpt/\.metadata: unreadable metadata \(pickle data was truncated"):
        load_shards(files, plain, trainable_only=False, source="ckpt")


@pytest.mark.parametrize("damage", ["truncated", "zeroed", "missing"])
def test_damaged_shard_is_corrupt(run, plain, damage):
    files = dict(run["full"])
    data = files["__1_0.distcp"]
    if damage == "missing":
        del files["__1_0.distcp"]
    else:
        files["__1_0.distcp"] = data[: len(data) // 2] if damage == "truncated" else bytes(len(data))
    with pytest.raises(CorruptCheckpoint) as err:
        load_shards(files, plain, trainable_only=False, source="ckpt")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("ckpt/__1_0.distcp: " + {"zeroed": "unreadable"}.get(damage, damage)), msg


def test_checkpoint_of_other_parts_is_corrupt_and_leaves_a_fresh_optimizer_fresh(run, tmp_path):
    policy = _policy(run["model_dir"])
    optim = torch.optim.AdamW(policy.parameters())
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    with pytest.raises(CorruptCheckpoint, match="no policy.model.model.embed_tokens.weight"):
        load_shards(run["lora"], {"policy": (policy, optim)}, trainable_only=False, source="lora")
    assert not optim.state  # a fresh start after the error still takes AdamW's first step at step 1
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())
