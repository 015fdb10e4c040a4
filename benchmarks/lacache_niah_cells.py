"""LaCache Figs. 8-9: the word needle under LaCache's retrieval protocol at one more length, the same jobs as
``benchmarks/quality_runs.py``'s ``lacache-niah-officialprotocol-*`` (full prefill, compact once, 64 sinks,
S = round(30 x budget share), O = 0) at 50 % and 25 % budgets, with records in the fidelity examples' format
(``niah-<length>-d<depth>``, methods named as there), so that a ledger row can pool them with the grid's cells.

    OMP_NUM_THREADS=1 python benchmarks/lacache_niah_cells.py --length 1536 --out FILE.examples.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv=None) -> int:
    import torch

    import kvlab
    import quality_runs
    from kvlab.eval import needle_in_haystack

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=1536)
    ap.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    quality_runs._STATE.update(seps=[], seps_broad=[])  # LaCache and StreamingLLM expressions name no separators
    depths = [float(d) for d in args.depths.split(",")]
    model, tok = kvlab.load_model("smollm2-135m", device=args.device, dtype="float32")
    with open(args.out, "w") as out:
        for frac in (0.5, 0.25):
            b, pct, span = int(frac * args.length), int(100 * frac), round(30 * frac)
            name = "lacache-niah-officialprotocol-{}" + str(pct)
            for name, expr in ((name.format("lacache"), f"LaCache.official({b}, {span}, 0, sink=64)"),
                               (name.format("strm"), f"StreamingLLM(sink=64, cache_size={b})")):
                t0 = time.perf_counter()
                r = needle_in_haystack(model, tok, quality_runs._policy(expr), lengths=[args.length], depths=depths,
                                       chunk_size=1 << 20, progress=False)
                for j, d in enumerate(depths):
                    common = {"example": f"niah-{args.length}-d{d}", "method": name, "output": r.answers[0][j],
                              "config": {"policy": expr, "length": args.length,
                                         "device": f"{args.device}, torch {torch.__version__}"}}
                    out.write(json.dumps({**common, "metric": "correct", "value": float(r.accuracy[0][j])}) + "\n")
                    out.write(json.dumps({**common, "metric": "answer_nll", "value": float(r.answer_nll[0][j])}) + "\n")
                out.flush()
                print(name, [float(x) for x in r.accuracy[0]], f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
