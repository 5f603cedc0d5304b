"""`python -m orchestrator export` on a real one-rank LoRA learner's checkpoint (the tiny model, in-process, no
Ray): a PEFT adapter directory and a merged model whose logits equal the learner's, the manifest, and the
refusals (a damaged checkpoint, a missing step, a used --out) as one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from orchestrator import storage as store
from orchestrator.actors.models import resolve_model
from orchestrator.cli import main
from orchestrator.config.trial import TrialConfig

IDS = torch.tensor([[1, 5, 7, 9, 11, 4, 2, 8]])


def lora_checkpoint(model: str, root: Path):
    """A lone trial's directory `root` (<storage>/<name>, name "lone") with one sealed checkpoint of step 3 from a
    one-rank LoRA learner on `model` (a config model name or path) whose adapter moved away from the base (an
    export equal to the base would pass a weaker check). Returns (the checkpoint directory, the learner)."""
    from workers.learner.inputs import RunSettings
    from workers.learner.learner import Learner

    cfg = TrialConfig(name="lone", model={"name": model}, task={"name": "arithmetic"},
                      output_dir=str(root / "trial"))  # where a lone trial writes its metrics
    learner = Learner(resolve_model(cfg.model), learner=cfg.learner, credit=cfg.credit,
                      run=RunSettings(seed=0, total_steps=4))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))
    ck = root / "lone" / "checkpoint_000001"
    ck.mkdir(parents=True)
    for name, data in learner.checkpoint_files().items():
        (ck / name).write_bytes(data)
    (ck / store.METRICS_FILE).write_text(json.dumps({"step": 3}) + "\n")
    (ck / store.STATE_FILE).write_text(json.dumps({"step": 3, "adapter_version": 4,
                                                   "config": cfg.model_dump(mode="json")}))
    store.seal_checkpoint(ck)
    (root / store.TRIAL_CONFIG_FILE).write_text(json.dumps(cfg.model_dump(mode="json")))
    learner.model.eval()
    return ck, learner


@pytest.fixture(scope="module")
def trial(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("export") / "lone"
    ck, learner = lora_checkpoint("tiny", root)
    with torch.no_grad():
        want = learner.model(input_ids=IDS).logits.float()
    return {"root": root, "checkpoint": ck, "logits": want, "base": resolve_model(TrialConfig(
        model={"name": "tiny"}, task={"name": "arithmetic"}).model)}


def export(capsys, *argv) -> tuple[int, str, str]:
    code = main(["export", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


def test_adapter_export_loads_with_peft_and_equals_the_learner(trial, tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "adapter"
    code, printed, _ = export(capsys, trial["root"], "--out", out)
    assert code == 0 and printed.startswith("exported lone step 3 (adapter) of tiny")
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    base = AutoModelForCausalLM.from_pretrained(trial["base"], dtype=torch.float32)
    before = logits(base)
    got = logits(PeftModel.from_pretrained(base, str(out)))
    assert (got - trial["logits"]).abs().max() < 1e-5
    assert (before - trial["logits"]).abs().max() > 1e-3  # the export is not the base

    manifest = json.loads((out / "export_manifest.json").read_text())
    assert (manifest["trial"], manifest["step"], manifest["policy_version"], manifest["kind"],
            manifest["base_model"]) == ("lone", 3, 4, "adapter", "tiny")
    assert manifest["checkpoint"] == str(trial["checkpoint"])
    files = {p.name for p in out.iterdir()} - {"export_manifest.json"}
    assert set(manifest["files"]) == files
    for name, meta in manifest["files"].items():
        data = (out / name).read_bytes()
        assert meta == {"bytes": len(data), "sha256": store.sha256_hex(data)}
    assert "tokenizer.json" in manifest["copied_from_base"]
    assert (out / "tokenizer.json").read_bytes() == (Path(trial["base"]) / "tokenizer.json").read_bytes()


def test_the_model_card_says_which_run_what_it_scored_and_how_to_load_it(trial, tmp_path, capsys):
    """README.md is our card, not PEFT's blank one: its front matter reads back the trial, step, base model, the
    held-out metrics of this policy (the training evaluation of step 4 and an `eval` command row of checkpoint 3,
    not those of other steps), the credit / intervention settings and the config beside it."""
    from orchestrator.trial.model_card import CARD_KEY, read_card

    cfg = TrialConfig.model_validate(json.loads((trial["root"] / store.TRIAL_CONFIG_FILE).read_text()))
    metrics = Path(cfg.output_dir) / store.METRICS_FILE
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text("".join(json.dumps({"step": s, "eval/pass@1": s / 10, "eval/pass@k": s / 5, "eval/k": 4,
                                           "train/loss": 1.0}) + "\n" for s in range(6)))
    (Path(cfg.output_dir) / store.EVAL_DIR).mkdir()
    (Path(cfg.output_dir) / store.EVAL_DIR / "gsm.csv").write_text(
        "checkpoint_step,eval_step,set,pass@1,problems\n3,4,gsm,0.25,64\n5,6,gsm,0.75,64\n")
    out = tmp_path / "carded"
    assert export(capsys, trial["root"], "--out", out)[0] == 0
    card = read_card(out / "README.md")
    facts = card[CARD_KEY]
    assert "base_model" not in card and card["library_name"] == "peft"  # "tiny" is a local model, no hub id
    assert (facts["campaign"], facts["trial"], facts["seed"], facts["step"], facts["policy_version"], facts["kind"],
            facts["base_model"]) == (None, "lone", 0, 3, 4, "adapter", "tiny")
    assert facts["heldout"] == {"training (evaluation of step 4)": {"eval/pass@1": 0.4, "eval/pass@k": 0.8,
                                                                    "eval/k": 4},
                                "eval command: gsm": {"checkpoint_step": 3, "eval_step": 4, "set": "gsm",
                                                      "pass@1": 0.25, "problems": 64}}
    assert facts["credit"] == cfg.credit.model_dump(mode="json")
    assert facts["interventions"] == cfg.interventions.model_dump(mode="json")
    assert json.loads((out / facts["config"]).read_text()) == cfg.model_dump(mode="json")
    text = (out / "README.md").read_text()
    assert "More Information Needed" not in text and f'PeftModel.from_pretrained(base, "{out}")' in text
    assert f'AutoModelForCausalLM.from_pretrained("{trial["base"]}")' in text and "LoRARequest(" in text
    assert "--merge" in text
    manifest = json.loads((out / "export_manifest.json").read_text())
    assert manifest["files"]["README.md"]["sha256"] == store.sha256_hex((out / "README.md").read_bytes())


def test_a_campaign_trials_card_names_its_condition_sweep_and_hub_base():
    """A campaign's trial: condition, seed and swept values from its labels, the hub id as `base_model`; a merged
    or full export loads as a plain model."""
    from orchestrator.trial.model_card import CARD_KEY, Exported, card_text, hub_id

    cfg = TrialConfig(name="C4_s1", seed=1, model={"name": "Qwen/Qwen2.5-0.5B-Instruct"}, task={"name": "arithmetic"},
                      labels={"condition": "C4", "seed": 1, "interventions.kl.coef": 0.1},
                      interventions={"kl": {"coef": 0.1}})
    e = Exported("C4_s1", "demo", 15, 16, "merged", "/ck/checkpoint_000003", cfg, "/cache/qwen")
    text = card_text(e, "/out")
    import yaml

    card = yaml.safe_load(text.split("---\n")[1])
    facts = card[CARD_KEY]
    assert card["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct" and card["library_name"] == "transformers"
    assert (facts["campaign"], facts["condition"], facts["seed"], facts["swept"], facts["step"]) == (
        "demo", "C4", 1, {"interventions.kl.coef": 0.1}, 15)
    assert facts["interventions"]["kl"]["coef"] == 0.1 and facts["heldout"] == {}
    assert "campaign `demo`, trial `C4_s1` (condition `C4`, seed 1, interventions.kl.coef = 0.1)" in text
    assert 'AutoModelForCausalLM.from_pretrained("/out")' in text and "LoRARequest" not in text
    assert "python -m orchestrator eval <campaign file> --step 15" in text
    assert [hub_id(n) for n in ("tiny-reasoner", "/abs/path", "org/model", "org/model/extra")] == [
        None, None, "org/model", None]


def test_merged_export_is_a_plain_model_equal_to_the_learner(trial, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    assert export(capsys, trial["root"], "--out", out, "--merge")[0] == 0
    assert not (out / "adapter_config.json").exists()
    got = logits(AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32))
    assert (got - trial["logits"]).abs().max() < 1e-5


@pytest.mark.parametrize(("argv", "needle"), [
    (["--step", "9"], "no checkpoint of step 9; checkpoints kept: step 3"),
    (["--trial", "x"], "--trial goes with a campaign YAML"),
])
def test_bad_requests_are_one_line(trial, tmp_path, capsys, argv, needle):
    code, out, err = export(capsys, trial["root"], "--out", tmp_path / "o", *argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and needle in err, err


def test_used_out_and_a_non_trial_directory_are_refused(trial, tmp_path, capsys):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    code, _, err = export(capsys, trial["root"], "--out", tmp_path / "used")
    assert code == 2 and "not empty" in err and len(err.splitlines()) == 1
    code, _, err = export(capsys, tmp_path, "--out", tmp_path / "o")
    assert code == 2 and "not a trial directory" in err and len(err.splitlines()) == 1


def test_a_damaged_checkpoint_is_refused(trial, tmp_path, capsys):
    import shutil

    root = tmp_path / "lone"
    shutil.copytree(trial["root"], root)
    blob = root / "lone" / "checkpoint_000001" / "learner.pt"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    code, out, err = export(capsys, root, "--out", tmp_path / "o")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert f"{blob}: " in err and "checksum does not match the manifest" in err
    assert not (tmp_path / "o").exists()
