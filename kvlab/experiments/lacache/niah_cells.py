"""LaCache Figs. 8-9: the word needle under LaCache's retrieval protocol at one more length, the jobs of
``kvlab.experiments.quality.runs``' ``lacache_protocol_jobs`` (full prefill, compact once, 64 sinks,
S = round(30 x budget share), O = 0; 50 % and 25 % budgets) run by its worker function, with records in the fidelity examples' format
(``niah-<length>-d<depth>``, methods named as there), so that a ledger row can pool them with the grid's cells.

    OMP_NUM_THREADS=1 python -m kvlab.experiments.lacache.niah_cells --length 1536 --out FILE.examples.jsonl
"""

from __future__ import annotations

import argparse
import json
import time



def main(argv=None) -> int:
    import torch

    import kvlab
    from kvlab.experiments.quality import runs as quality_runs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=1536)
    ap.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    depths = [float(d) for d in args.depths.split(",")]
    model, tok = kvlab.load_model("smollm2-135m", device=args.device, dtype="float32")
    # quality_runs' worker state: LaCache and StreamingLLM expressions name no separators
    quality_runs._STATE.update(model=model, tokenizer=tok, seps=[], seps_broad=[])
    with open(args.out, "w") as out:
        for job in quality_runs.lacache_protocol_jobs("niah", args.length, depths):
            t0 = time.perf_counter()
            r = quality_runs._run_retrieval("niah", job.args)
            name = job.name.removesuffix(f"-{args.length}")  # the grid's method name, its length in the example
            for j, d in enumerate(depths):
                common = {"example": f"niah-{args.length}-d{d}", "method": name, "output": r["answers"][0][j],
                          "config": {"policy": job.args["policy"], "length": args.length,
                                     "device": f"{args.device}, torch {torch.__version__}"}}
                out.write(json.dumps({**common, "metric": "correct", "value": float(r["accuracy"][j])}) + "\n")
                out.write(json.dumps({**common, "metric": "answer_nll", "value": float(r["answer_nll"][j])}) + "\n")
            out.flush()
            print(name, r["accuracy"], f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
