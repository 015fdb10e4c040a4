"""How a GSM8K comparison was won, read from its per-problem records: which stop ended each generation, and how many
of A's wins over B are B's run-ons (B wrote the right "The answer is X." and generated on, so flexible-extract,
which reads the last number, read a wrong one).

The records are those of ``kvlab.eval.gsm8k`` (one ``flexible_match`` and one ``strict_match`` record per problem
and method, the first with the generation's ``stop``: a stop string, ``"token <id>"``, or ``"max_new_tokens"`` when
none came). The ledger's headline row quotes :func:`how_won_text`; ``tests/test_claims_verdict_words.py`` checks that
its note says what the records give.
"""
from __future__ import annotations

from collections import Counter, defaultdict

__all__ = ["how_won", "how_won_text", "STOP_RULE"]

#: kvlab's GSM8K stop rule against lm-eval gsm8k-cot's (``kvlab.eval.gsm8k``), in one sentence
STOP_RULE = ("generation stops at the tokenizer's EOS, at lm-eval gsm8k-cot's `until` strings (Q:, </s>, "
             "<|im_end|>) and, beyond lm-eval's list, at the chat families' turn markers (<|endoftext|>, "
             "<|im_start|>, Human:, User:, three newlines ...), or after max_new_tokens = 256; the text is cut at the "
             "earliest stop string, as lm-eval cuts at its `until`")


def how_won(files: str, a: str, b: str) -> dict:
    """From the ``;``-joined records ``files`` of a GSM8K run, for methods ``a`` and ``b``: ``problems`` (paired),
    ``stops`` per method (``Counter`` of stop reasons), ``max_new_tokens`` per method (generations that no stop
    ended), ``wins`` (problems where A is right and B wrong under flexible-extract), and ``run_on_wins`` (those of
    the wins where B's strict-match is right: B had written the right answer and generated on)."""
    from kvlab.experiments import records

    values: dict = defaultdict(dict)
    stops: dict = defaultdict(dict)
    for f in files.split(";"):
        for r, _ in records.iter_records(f.strip(), where=f.strip()):
            if r["method"] in (a, b) and r["metric"] in ("flexible_match", "strict_match"):
                values[(r["method"], r["metric"])][r["example"]] = float(r["value"])
                if r["metric"] == "flexible_match":
                    stops[r["method"]][r["example"]] = r.get("stop") or "not recorded"
    problems = sorted(set(values[(a, "flexible_match")]) & set(values[(b, "flexible_match")]))
    if not problems:
        raise ValueError(f"no problem with flexible_match records of both {a!r} and {b!r} in {files}")
    wins = [e for e in problems if values[(a, "flexible_match")][e] == 1 and values[(b, "flexible_match")][e] == 0]
    run_on = [e for e in wins if values[(b, "strict_match")].get(e) == 1]
    per_method = {m: Counter(stops[m][e] for e in problems) for m in (a, b)}
    return {"problems": len(problems), "stops": per_method,
            "max_new_tokens": {m: c["max_new_tokens"] for m, c in per_method.items()},
            "wins": len(wins), "run_on_wins": len(run_on)}


def how_won_text(files: str, a: str, b: str, *, also: tuple[str, ...] = ()) -> str:
    """:func:`how_won` as the sentence the ledger's note carries; ``also`` adds the max_new_tokens count of more
    methods of the same records (Vanilla)."""
    w = how_won(files, a, b)
    hit = dict(w["max_new_tokens"])
    for m in also:
        hit[m] = how_won(files, m, b)["max_new_tokens"][m]
    return (f"How it was won: {w['run_on_wins']} of {a}'s {w['wins']} wins over {b} (flexible-extract, "
            f"{w['problems']:,} problems) are problems where {b} had written the right \"The answer is X.\" "
            "(strict-match right) and generated on, so the last number read was wrong; no stop ended "
            + ", ".join(f"{m} in {k:,}" for m, k in hit.items())
            + f" of {w['problems']:,} generations (they ran to max_new_tokens). Stop rule: {STOP_RULE}.")
