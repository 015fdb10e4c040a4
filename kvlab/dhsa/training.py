"""Training the DHSA boundary predictor (App. B): labels from the model's attention, focal loss on keys.

Paper: DHSA (arXiv:2510.24606), App. B "Training of the boundary predictor". Two steps:

1. **Labels** (:func:`make_labels`): one forward pass per text sample; a recording pattern in every
   chosen layer computes that layer's attention, turns it into the ratios ``r_t`` of Eq. 5-7
   (:func:`kvlab.dhsa.boundary_predictor.label_ratios`) and keeps *only those* (``n`` floats per layer:
   "storing only boundary labels", App. B). A :class:`LabelSet` is a small file.
2. **Training** (:func:`train_predictor`): for each sample, one forward pass records the keys of
   *all* chosen layers ("training all layers simultaneously": one pass, not one per layer); one
   predictor shared by the layers gets the focal loss (Eq. 9) of every layer against the soft
   labels (Eq. 8); one optimiser step per sample.

Command line (documented with ``--help``)::

    python -m kvlab.dhsa.training --model smollm2-135m --corpus wikitext --samples 48 --seq-len 512 \\
        --epochs 2 --out predictor.pt

runs on a CPU in a few minutes and writes the predictor (about 1.4 MB for SmolLM2-135M) with its
configuration, training command and metrics; :func:`load_predictor` reads it back. kvlab ships trained
predictors for SmolLM2-135M in ``kvlab/dhsa/data/`` (each with its command, parameters, metrics and sha256 in a
JSON sidecar); :func:`shipped_predictor` picks one and checks it. The one the experiments use,
``smollm2-135m-l0-unrotated.pt``, reads layer 0's keys with RoPE undone (``--unrotate``): its input carries no
absolute position, so a text gets the same chunks wherever it sits in a long input (the files on rotated keys,
trained on 1,024-token windows, place their boundaries by position past 1,024 tokens).

Readings (App. B; values from the authors' ``legacy/boundary_predictor/train.py`` unless said):
window ``w = 4``, 8 heads, hidden 256; soft label ``sigmoid(2 (ln r - ln 2))``; focal ``gamma = 2``,
``pos_weight = 1.3``; Adam. The authors' learning rate is ``1e-4`` over 2 epochs of 30k samples;
ours (``1e-3``) is for tens of samples. They binarise the soft labels (``hard_labels=True`` here);
the text trains on the soft ones (our default).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvlab.core import AttentionCall, AttentionPattern, attend, use_pattern

from .boundary_predictor import BoundaryPredictor, focal_bce_loss, key_features, label_ratios, label_valid, soft_labels
from .boundary_predictor import on_device_of

__all__ = ["LabelRecorder", "LabelSet", "TrainResult", "text_samples", "make_labels", "record_keys",
           "train_predictor", "evaluate_predictor", "calibrate_threshold", "save_predictor", "load_predictor", "default_predictor_path",
           "shipped_predictor", "SHIPPED", "main"]

SHIPPED = Path(__file__).parent / "data"  # trained predictors shipped with kvlab: <model>.pt + <model>.json


class LabelRecorder(AttentionPattern):
    """Dense attention that also records, per layer, the label ratios (Eq. 5-7) and/or the keys.

    ``ratios[layer]``: ``(batch, seq)`` float32 on the CPU; ``keys[layer]``: ``(batch, kv_heads, seq, dim)``
    as the layer's attention sees them (RoPE applied), detached. Sliding-window layers get the code's
    ``horizon`` (only queries inside the window count).
    """

    def __init__(self, window: int = 4, rule: str = "code", labels: bool = True, keys: bool = False):
        self.window, self.rule, self.labels, self.keep_keys = window, rule, labels, keys
        self.ratios: dict[int, torch.Tensor] = {}
        self.keys: dict[int, torch.Tensor] = {}

    def __call__(self, query, key, value, call: AttentionCall) -> torch.Tensor:
        mask = call.causal_mask()
        out, probs = attend(query, key, value, mask, call.scaling, want_probs=self.labels)
        if self.labels:
            attn = probs.mean(1)  # (batch, q, n): heads averaged, as the authors' code
            horizon = call.sliding_window
            self.ratios[call.layer_idx] = label_ratios(attn, self.window, rule=self.rule,
                                                       horizon=horizon).float().cpu()
        if self.keep_keys:
            self.keys[call.layer_idx] = key.detach()
        return out


def text_samples(tokenizer, text: str, seq_len: int, count: int, *, offset: int = 0) -> list[torch.Tensor]:
    """``count`` windows of ``seq_len`` token ids cut one after another from ``text`` (1-d LongTensors)."""
    need = offset + seq_len * count
    chars = 8 * need  # English runs about 4-5 characters a token: tokenize a generous prefix, not a whole corpus
    while True:
        ids = tokenizer(text[:chars], return_tensors="pt", add_special_tokens=False).input_ids[0]
        if ids.numel() >= need or chars >= len(text):
            break
        chars *= 2
    ids = ids[offset:]
    have = ids.numel() // seq_len
    if have < count:
        raise ValueError(f"the text gives {have} windows of {seq_len} tokens after offset {offset}, asked for {count}")
    return [ids[i * seq_len:(i + 1) * seq_len].clone() for i in range(count)]


@dataclass
class LabelSet:
    """Token ids of each sample and the label ratios of each chosen layer: all that App. B stores."""

    ids: list[torch.Tensor]
    ratios: list[dict[int, torch.Tensor]]  # one {layer: (seq,) float32} per sample
    layers: list[int]
    window: int
    rule: str
    keys: list[dict[int, torch.Tensor]] | None = None  # optional cache of the keys (never saved: App. B stores labels)

    def save(self, path) -> None:
        torch.save(dict(ids=self.ids, ratios=self.ratios, layers=self.layers, window=self.window, rule=self.rule),
                   path)

    @classmethod
    def load(cls, path) -> "LabelSet":
        d = torch.load(path, weights_only=True)
        return cls(d["ids"], d["ratios"], d["layers"], d["window"], d["rule"])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.ids) + sum(
            r.numel() * r.element_size() for s in self.ratios for r in s.values())


@torch.no_grad()
def make_labels(model, samples: list[torch.Tensor], layers: list[int], *, window: int = 4,
                rule: str = "code", keep_keys: bool = False, batch: int = 1) -> LabelSet:
    """Labels of every chosen layer from one forward pass per sample (App. B).

    ``keep_keys``: also keep each sample's keys (on the model's device) in ``LabelSet.keys``, so that
    training and evaluation skip their own forward passes (memory: ``layers x seq x channels`` floats per
    sample, e.g. 24 MB for SmolLM2 at 1024 tokens; for a GPU run). ``batch``: samples of one length per forward
    pass (the same labels: every sample attends only to itself; fewer, larger passes on a GPU).
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1 (samples per forward pass), got {batch!r}")
    dev = model.device
    ratios, keys = [], []
    for start in range(0, len(samples), batch):
        group = samples[start:start + batch]
        if len({int(s.numel()) for s in group}) > 1:  # different lengths: one at a time
            sub = [[s] for s in group]
        else:
            sub = [group]
        for part in sub:
            rec = LabelRecorder(window, rule, labels=True, keys=keep_keys)
            with use_pattern(model, rec, layers):
                model(input_ids=torch.stack(part).to(dev), use_cache=False, logits_to_keep=1)  # no logits needed
            for j in range(len(part)):
                ratios.append({layer: rec.ratios[layer][j] for layer in layers})
                if keep_keys:
                    keys.append({layer: rec.keys[layer][j:j + 1] for layer in layers})
    return LabelSet([s.cpu() for s in samples], ratios, list(layers), window, rule, keys if keep_keys else None)


def _sample_keys(model, labels: LabelSet, i: int) -> dict[int, torch.Tensor]:
    """Sample ``i``'s keys of every layer: the cache if ``labels`` kept them, else one forward pass."""
    if labels.keys is not None:
        return labels.keys[i]
    return record_keys(model, labels.ids[i], labels.layers)


@torch.no_grad()
def record_keys(model, ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """Keys of every chosen layer from one forward pass (``(1, kv_heads, seq, dim)`` each)."""
    rec = LabelRecorder(labels=False, keys=True)
    with use_pattern(model, rec, layers):
        model(input_ids=ids[None].to(model.device), use_cache=False, logits_to_keep=1)  # no logits needed
    return rec.keys


@torch.no_grad()
def calibrate_threshold(model, predictor: BoundaryPredictor, labels: LabelSet, *, nms_window: int = 8,
                        alpha: float = 2.0, beta: float = -2.0 * math.log(2.0)) -> dict:
    """The probability threshold at which the predictor places as many boundaries as the labels do.

    Over the held-out windows and layers, the labels' boundaries are the hard positives (soft label >= 0.5,
    Eq. 8) after NMS (``nms_window``); the predictor's are ``p > t`` after the same NMS. ``t`` runs over
    0.05, 0.10, ..., 0.95 and the one whose total count is nearest the labels' is returned (ties: the higher
    ``t``). Reading (ours): the paper gives no threshold and the authors' code thresholds the logit at a
    fixed value; a predictor trained on sparse labels (layer 0 places about two boundaries per 100 tokens)
    rarely reaches p = 0.5 outside the clearest positions, so a fixed 0.5 under-chunks.

    Returns ``{"threshold", "label_boundaries", "predicted_boundaries"}`` (totals over windows and layers).
    """
    from .boundary_predictor import nms_boundaries

    grid = [round(0.05 * i, 2) for i in range(1, 20)]
    want, have = 0, dict.fromkeys(grid, 0)
    predictor.eval()
    for i in range(len(labels.ids)):
        keys = _sample_keys(model, labels, i)
        for layer in labels.layers:
            x = predictor.features(keys[layer]).float()
            n = x.shape[1]
            valid = label_valid(n, predictor.window, x.device)[None]
            y = _targets(labels.ratios[i][layer].to(x.device), alpha, beta, False)[None]
            want += len(nms_boundaries(y, max_chunks=n, threshold=0.4999, nms_window=nms_window,
                                       valid=valid)[0]) - 2
            p = torch.sigmoid(on_device_of(predictor, x)(x).float())
            for t in grid:
                have[t] += len(nms_boundaries(p, max_chunks=n, threshold=t, nms_window=nms_window,
                                              valid=valid)[0]) - 2
    best = min(grid, key=lambda t: (abs(have[t] - want), -t))
    return {"threshold": best, "label_boundaries": want, "predicted_boundaries": have[best]}


def _targets(ratios: torch.Tensor, alpha: float, beta: float, hard: bool) -> torch.Tensor:
    y = soft_labels(ratios.double(), alpha=alpha, beta=beta).float()
    return (y >= 0.5).float() if hard else y


@dataclass
class TrainResult:
    predictor: BoundaryPredictor
    losses: list[float] = field(default_factory=list)  # mean loss over layers, per step
    seconds: float = 0.0
    config: dict = field(default_factory=dict)


def train_predictor(model, labels: LabelSet, *, predictor: BoundaryPredictor | None = None, epochs: int = 1,
                    lr: float = 1e-3, heads: int = 8, hidden: int = 256, encoder: str = "separate",
                    alpha: float = 2.0, beta: float = -2.0 * math.log(2.0), gamma: float = 2.0,
                    pos_weight: float = 1.3, hard_labels: bool = False, seed: int = 0,
                    log_every: int = 0, max_seconds: float | None = None,
                    rope_theta: float | None = None) -> TrainResult:
    """Train one predictor for all ``labels.layers`` (App. B), one optimiser step per sample.

    Each step: one forward pass of the frozen model records the keys of every layer; the focal loss
    (Eq. 9) of each layer against the soft labels (Eq. 8) is averaged over layers and positions
    (:func:`kvlab.dhsa.boundary_predictor.label_valid`). ``rope_theta``: a new predictor sees the keys with their
    rotary embedding undone (``BoundaryPredictor(rope_theta=...)``: no absolute position in its input). Keys are
    recomputed at every step: only labels are stored
    (unless ``labels.keys`` holds them). ``max_seconds``: stop after the step that passes this wall-clock budget
    (``result.config["stopped_early"]`` says so; for runs under a hard time limit).
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    torch.manual_seed(seed)
    dev = model.device
    probe = record_keys(model, labels.ids[0][:16], labels.layers[:1])
    channels = key_features(next(iter(probe.values()))).shape[-1]
    if predictor is None:
        predictor = BoundaryPredictor(channels, window=labels.window, heads=heads, hidden=hidden, encoder=encoder,
                                      rope_theta=rope_theta)
    elif predictor.channels != channels:
        raise ValueError(f"predictor has {predictor.channels} channels, the model's keys {channels}")
    predictor = predictor.to(dev).train()
    opt = torch.optim.Adam(predictor.parameters(), lr=lr)
    result = TrainResult(predictor, config=dict(epochs=epochs, lr=lr, alpha=alpha, beta=beta, gamma=gamma,
                                                pos_weight=pos_weight, hard_labels=hard_labels, seed=seed))
    order = list(range(len(labels.ids)))
    rng = random.Random(seed)
    t0 = time.perf_counter()
    step = 0
    stop = False
    for _ in range(epochs):
        rng.shuffle(order)
        for i in order:
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                stop = True
                break
            keys = _sample_keys(model, labels, i)
            # every layer of the sample in one predictor call (a batch of layers): the mean over layers and
            # valid positions equals the mean over layers of each layer's mean (same length, same valid mask)
            x = torch.cat([predictor.features(keys[layer]).float() for layer in labels.layers])  # (layers, n, C)
            n = x.shape[1]
            y = torch.stack([_targets(labels.ratios[i][layer], alpha, beta, hard_labels)
                             for layer in labels.layers]).to(dev)
            logits = predictor(x)
            mask = label_valid(n, predictor.window, dev)[None].expand_as(y)
            loss = focal_bce_loss(logits, y, pos_weight=pos_weight, gamma=gamma, mask=mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            result.losses.append(float(loss.detach()))
            step += 1
            if log_every and step % log_every == 0:
                print(f"step {step}: loss {result.losses[-1]:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if stop:
            break
    result.config.update(steps=step, stopped_early=stop)
    result.seconds = time.perf_counter() - t0
    predictor.eval()
    return result


@torch.no_grad()
def evaluate_predictor(model, predictor: BoundaryPredictor, labels: LabelSet, *, alpha: float = 2.0,
                       beta: float = -2.0 * math.log(2.0), gamma: float = 2.0, pos_weight: float = 1.3) -> dict:
    """Validation metrics of App. B over samples and layers: focal loss, precision / recall / F1 of
    ``p >= 0.5`` against the hard labels (``y >= 0.5``), and top-k overlap (``k`` = number of hard
    positives: the share of the ``k`` highest-ratio positions among the ``k`` highest predictions)."""
    predictor.eval()
    dev = model.device
    tp = fp = fn = 0
    overlaps, losses = [], []
    for i, ids in enumerate(labels.ids):
        keys = _sample_keys(model, labels, i)
        for layer in labels.layers:
            x = predictor.features(keys[layer]).float()
            n = x.shape[1]
            valid = label_valid(n, predictor.window, dev)
            r = labels.ratios[i][layer].to(dev)
            y = _targets(r, alpha, beta, False)
            logits = on_device_of(predictor, x)(x)[0]
            losses.append(float(focal_bce_loss(logits[None], y[None], pos_weight=pos_weight, gamma=gamma,
                                               mask=valid[None])))
            pred, hard = (logits >= 0)[valid], (y >= 0.5)[valid]
            tp += int((pred & hard).sum())
            fp += int((pred & ~hard).sum())
            fn += int((~pred & hard).sum())
            k = int(hard.sum())
            if k:
                top_r = set(torch.topk(r[valid], k).indices.tolist())
                top_p = set(torch.topk(logits[valid], k).indices.tolist())
                overlaps.append(len(top_r & top_p) / k)
    precision = tp / max(tp + fp, 1)
    recall = tp / max(tp + fn, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    return dict(loss=sum(losses) / len(losses), precision=precision, recall=recall, f1=f1,
                topk_overlap=sum(overlaps) / max(len(overlaps), 1), positives=(tp + fn))


def save_predictor(predictor: BoundaryPredictor, path, meta: dict | None = None) -> str:
    """Write the predictor (configuration, weights, ``meta``) to ``path``; returns its sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in predictor.state_dict().items()}
    torch.save(dict(config=predictor.config(), state_dict=state, meta=meta or {}), path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_predictor(path, device=None) -> tuple[BoundaryPredictor, dict]:
    """Read a predictor written by :func:`save_predictor`: ``(predictor in eval mode, meta)``."""
    d = torch.load(path, map_location="cpu", weights_only=True)
    p = BoundaryPredictor(**d["config"])
    p.load_state_dict(d["state_dict"])
    p.source = Path(path).name  # records name the predictor by its file
    # the threshold calibrated at training (calibrate_threshold); DHSAPattern uses it when given none
    p.calibrated_threshold = d.get("meta", {}).get("calibration", {}).get("threshold")
    return p.to(device or "cpu").eval(), d.get("meta", {})


def shipped_predictor(model_name: str = "smollm2-135m", device=None, *, layer: int = 0,
                      file: str | None = None) -> tuple[BoundaryPredictor, dict]:
    """The trained predictor kvlab ships for ``model_name`` (``kvlab/dhsa/data/<model>*.pt``), checked against
    the sha256 in its JSON sidecar, which also records the training command, parameters and validation
    metrics. Returns ``(predictor in eval mode, sidecar dict)``.

    Several files may be shipped; the one used is the better one *for the layer the boundaries are taken from*
    (``layer``: DHSA's experiments predict from the first layer's keys and share the boundaries, as the
    authors' code does): a predictor trained on that layer's labels first, one trained on that layer alone
    before one trained on many, one that reads the keys without their rotary embedding (``rope_theta`` in its
    configuration: its boundaries follow the text, not the position) before one on rotated keys, then the
    higher held-out F1. A predictor trained on all layers places almost
    no boundary at layer 0 (its keys differ from the other layers'). ``file`` picks one by name instead."""
    import glob

    if not isinstance(model_name, str) or not model_name.strip():
        raise ValueError(f"model_name must be a model's name such as 'smollm2-135m', got {model_name!r} (kvlab ships "
                         f"predictors for: {sorted(p.stem for p in SHIPPED.glob('*.pt'))})")
    # the name is a name, never a pattern: "*" or "[" find no file instead of every file or a pattern error
    cands = sorted(SHIPPED.glob(f"{glob.escape(model_name)}*.json"))
    if file is not None:
        cands = [SHIPPED / (Path(file).stem + ".json")]
    infos = [(json.loads(c.read_text()), c) for c in cands if c.exists() and c.with_suffix(".pt").exists()]
    infos = [(i, c) for i, c in infos if i.get("model") == model_name or c.stem == model_name]
    if not infos:
        have = sorted(p.stem for p in SHIPPED.glob("*.pt"))
        raise ValueError(f"no shipped DHSA predictor for {model_name!r}{'' if file is None else f' named {file!r}'} "
                         f"(kvlab ships: {have}); train one with python -m kvlab.dhsa.training --model {model_name} "
                         "and load it with load_predictor(path)")

    def rank(item):
        info = item[0]
        layers = info.get("layers") or []
        position_free = (info.get("predictor") or {}).get("rope_theta") is not None
        return (layer in layers, layers == [layer], position_free, (info.get("validation") or {}).get("f1", 0.0))

    info, sidecar = max(infos, key=rank)
    pt = sidecar.with_suffix(".pt")
    sha = hashlib.sha256(pt.read_bytes()).hexdigest()
    if sha != info["sha256"]:
        raise ValueError(f"{pt} has sha256 {sha}, its sidecar says {info['sha256']}: the file is damaged; "
                         f"reinstall kvlab or retrain it with: {info['command']}")
    predictor, _ = load_predictor(pt, device)
    return predictor, info


def default_predictor_path(model_name: str) -> Path:
    """Where the command line writes a model's predictor by default: ``<kvlab cache>/dhsa/predictor-<model>.pt``."""
    from kvlab.assets import cache_dir

    return cache_dir() / "dhsa" / f"predictor-{model_name}.pt"


def _corpus_spec(spec: str, default_count: int, flag: str) -> list[tuple[str, int]]:
    """``"wikitext"`` -> ``[("wikitext", default_count)]``; ``"austen:160,c4-sample:56"`` -> the named counts;
    ``"a,b"`` -> ``default_count`` split evenly (the remainder to the first ones)."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"{flag} must name at least one corpus, got {spec!r}")
    named = [p.partition(":") for p in parts]
    if all(sep for _, sep, _ in named):
        out = []
        for name, _, count in named:
            if not count.isdigit() or int(count) < 1:
                raise ValueError(f"{flag}: window count of {name!r} must be an int >= 1, got {count!r}")
            out.append((name, int(count)))
        return out
    if any(sep for _, sep, _ in named):
        raise ValueError(f"{flag}: give a count to every corpus (name:count,...) or to none, got {spec!r}")
    base, extra = divmod(default_count, len(parts))
    if base < 1:
        raise ValueError(f"{flag}: {default_count} windows cannot be spread over {len(parts)} corpora")
    return [(name, base + (j < extra)) for j, name in enumerate(parts)]


def _windows(tok, train_spec: list[tuple[str, int]], val_spec: list[tuple[str, int]], seq_len: int):
    """Training and held-out token windows, one tokenization per corpus: a corpus in both lists gives its
    held-out windows right after its training windows, so they never overlap."""
    from kvlab.datasets import load_text

    want: dict[str, list[int]] = {}
    for k, (spec) in enumerate((train_spec, val_spec)):
        for name, count in spec:
            want.setdefault(name, [0, 0])[k] += count
    cut = {name: text_samples(tok, load_text(name), seq_len, tr + va) for name, (tr, va) in want.items()}
    train = [w for name, count in train_spec for w in cut[name][:count]]
    val = [w for name, count in val_spec for w in cut[name][want[name][0]:want[name][0] + count]]
    return train, val


def write_sidecar(pt_path, meta: dict, **extra) -> Path:
    """The JSON next to a predictor file (``<name>.json``): file name, sha256, bytes, command, configuration,
    data, training settings and held-out metrics, as kvlab's shipped predictors carry."""
    pt_path = Path(pt_path)
    info = dict(model=meta.get("model"), file=pt_path.name, sha256=hashlib.sha256(pt_path.read_bytes()).hexdigest(),
                bytes=pt_path.stat().st_size, command=meta.get("command"),
                predictor=torch.load(pt_path, map_location="cpu", weights_only=True)["config"],
                layers=meta.get("layers"), data=meta.get("data"), train=meta.get("train"),
                first_loss=meta.get("first_loss"), last_loss=meta.get("last_loss"),
                validation=meta.get("validation"), calibration=meta.get("calibration"))
    info.update(extra)
    side = pt_path.with_suffix(".json")
    side.write_text(json.dumps(info, indent=1) + "\n")
    return side


def _chosen_layers(model, spec: str, dhsa_layers) -> list[int]:
    """``--layers``: "global" (no sliding window), "all", or a list such as "0,5,11"."""
    if spec == "global":
        return dhsa_layers(model)
    if spec == "all":
        return list(range(model.config.num_hidden_layers))
    return [int(x) for x in spec.split(",")]


def _keep_first_layers(model, keep: int) -> int:
    """Labels and keys of the first layers need only those layers: the model runs no others. Returns ``keep``."""
    if keep < model.config.num_hidden_layers:
        model.model.layers = model.model.layers[:keep]
        model.config.num_hidden_layers = keep
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:keep]
    return keep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kvlab.dhsa.training",
        description="Train the DHSA boundary predictor of a model on a corpus (App. B): labels from one forward "
                    "pass per sample, then one predictor for all global layers. Writes the predictor file, its "
                    "JSON sidecar (sha256, command, held-out metrics) and prints them.")
    ap.add_argument("--model", default="smollm2-135m", help="kvlab model id (python -m kvlab fetch --list)")
    ap.add_argument("--corpus", default="wikitext",
                    help="training corpus id, or several: 'a,b' (--samples split evenly) or 'a:160,b:56' (counts)")
    ap.add_argument("--val-corpus", default="paul-graham",
                    help="held-out corpus id(s), same forms (--val-samples each); a corpus also trained on gives "
                         "windows after its training windows")
    ap.add_argument("--samples", type=int, default=48, help="training windows (in all)")
    ap.add_argument("--val-samples", type=int, default=8, help="held-out windows per held-out corpus")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per window")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--window", type=int, default=4, help="w: predictor windows and labelling rule")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--encoder", choices=("separate", "joint"), default="separate")
    ap.add_argument("--rule", choices=("code", "notes"), default="code", help="reading of Eq. 5-7")
    ap.add_argument("--hard-labels", action="store_true", help="binarise the soft labels (the authors' script)")
    ap.add_argument("--pos-weight", type=float, default=1.3,
                    help="focal loss weight of the boundary class (the authors' 1.3); a larger one lifts the "
                         "probabilities at boundaries, so that a fixed threshold (the authors' logit > 1.1, p > 0.75) "
                         "keeps them")
    ap.add_argument("--unrotate", action="store_true",
                    help="feed the predictor the keys with RoPE undone (no absolute position: a text gets the same "
                         "boundaries wherever it sits); default: the rotated keys, as the authors")
    ap.add_argument("--layers", default="global", help="'global' (no sliding window), 'all', or e.g. 0,5,11")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--cache-keys", action="store_true",
                    help="keep every window's keys from the labelling pass (no forward pass per step; GPU memory: "
                         "layers x seq-len x channels floats per window)")
    ap.add_argument("--label-batch", type=int, default=1, help="windows per labelling forward pass")
    ap.add_argument("--max-train-seconds", type=float, default=None,
                    help="stop training after this many seconds (the sidecar records the steps done)")
    ap.add_argument("--compare", default=None,
                    help="a predictor file (or 'shipped') evaluated on the same held-out windows, for the sidecar")
    ap.add_argument("--out", default=None, help="output file (default: <kvlab cache>/dhsa/predictor-<model>.pt); "
                                                "the sidecar <out>.json is written beside it")
    args = ap.parse_args(argv)
    for name in ("samples", "val_samples", "seq_len", "epochs", "window", "heads", "hidden", "label_batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.seq_len < 4 * args.window + 2:
        ap.error(f"--seq-len must be >= 4 * window + 2 = {4 * args.window + 2} (labels need both windows)")
    try:
        train_spec = _corpus_spec(args.corpus, args.samples, "--corpus")
        val_spec = _corpus_spec(args.val_corpus, args.val_samples * len(args.val_corpus.split(",")), "--val-corpus")
    except ValueError as exc:
        ap.error(str(exc))
    if args.threads:
        torch.set_num_threads(args.threads)

    from kvlab.models import load_model

    from .pattern import dhsa_layers

    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    model, tok = load_model(args.model, dtype=torch.float32, device=args.device)
    n_layers = model.config.num_hidden_layers
    layers = _chosen_layers(model, args.layers, dhsa_layers)
    keep = _keep_first_layers(model, max(layers) + 1)
    rope_theta = None
    if args.unrotate:
        rope = getattr(model.config, "rope_parameters", None) or {}
        rope_theta = rope.get("rope_theta", getattr(model.config, "rope_theta", None))
        if rope.get("rope_type", "default") != "default" or rope_theta is None:
            ap.error(f"--unrotate undoes plain RoPE; {args.model} has rope parameters {rope!r}")
    print(f"[{time.perf_counter() - t_start:.0f} s] model loaded (running {keep} of {n_layers} layers)", flush=True)
    train_ids, val_ids = _windows(tok, train_spec, val_spec, args.seq_len)
    print(f"[{time.perf_counter() - t_start:.0f} s] {len(train_ids)} + {len(val_ids)} windows tokenized", flush=True)
    t0 = time.perf_counter()
    kw = dict(window=args.window, rule=args.rule, keep_keys=args.cache_keys, batch=args.label_batch)
    train_labels = make_labels(model, train_ids, layers, **kw)
    val_labels = make_labels(model, val_ids, layers, **kw)
    t_labels = time.perf_counter() - t0
    print(f"labels: {len(train_ids)} + {len(val_ids)} samples x {len(layers)} layers in {t_labels:.0f} s "
          f"({train_labels.nbytes() / 1e6:.2f} MB stored)", flush=True)
    res = train_predictor(model, train_labels, epochs=args.epochs, lr=args.lr, heads=args.heads, hidden=args.hidden,
                          encoder=args.encoder, hard_labels=args.hard_labels, seed=args.seed,
                          pos_weight=args.pos_weight,
                          log_every=max(1, len(train_ids) // 4), max_seconds=args.max_train_seconds,
                          rope_theta=rope_theta)
    t1 = time.perf_counter()
    metrics = evaluate_predictor(model, res.predictor, val_labels)
    t_val = time.perf_counter() - t1
    print(f"trained {len(res.losses)} steps in {res.seconds:.0f} s; loss {res.losses[0]:.4f} -> {res.losses[-1]:.4f}")
    print("validation:", json.dumps({k: round(v, 4) for k, v in metrics.items()}))
    calibration = calibrate_threshold(model, res.predictor, val_labels)
    print("calibrated threshold:", json.dumps(calibration))
    out = Path(args.out) if args.out else default_predictor_path(args.model)
    command = "python -m kvlab.dhsa.training " + " ".join(sys.argv[1:] if argv is None else argv)
    data = dict(train=dict(train_spec), val=dict(val_spec), seq_len=args.seq_len,
                val_note="held-out windows follow a corpus's training windows (no overlap)")
    meta = dict(model=args.model, layers=layers, command=command, train=res.config, validation=metrics,
                calibration=calibration,
                first_loss=res.losses[0], last_loss=res.losses[-1], data=data)
    sha = save_predictor(res.predictor, out, meta)
    extra = dict(device=str(model.device) + (f" ({torch.cuda.get_device_name(model.device)})"
                                             if model.device.type == "cuda" else ""),
                 wall_clock=f"labels {t_labels:.0f} s + {len(res.losses)} steps {res.seconds:.0f} s + validation "
                            f"{t_val:.0f} s; {time.perf_counter() - t_start:.0f} s with loading",
                 date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    if args.compare:
        if args.compare == "shipped":
            other, _ = shipped_predictor(args.model, model.device)
            name = f"shipped {args.model}.pt"
        else:
            other, _ = load_predictor(args.compare, model.device)
            name = str(args.compare)
        cmp_metrics = evaluate_predictor(model, other, val_labels)
        print(f"validation of {name}:", json.dumps({k: round(v, 4) for k, v in cmp_metrics.items()}))
        extra["compared"] = dict(predictor=name, config=other.config(), validation=cmp_metrics)
    side = write_sidecar(out, meta, **extra)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB) sha256 {sha}; sidecar {side}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
