"""``gpu-agent mig advise``: where the next instance of each profile should go (read only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from agent.cli.context import CliContext
from agent.cli.options import GPU_INDEX
from agent.cli.render import emit, format_table, output_option
from agent.errors import InvalidSpec

if TYPE_CHECKING:
    from agent.wire.mig import AdvisedGpu


def _advice_data(gpus: Sequence[AdvisedGpu]) -> list[dict[str, Any]]:
    """The advice as plain data: every field written, zeros included."""

    def counts(items: Sequence[tuple[str, int]]) -> dict[str, int]:
        return dict(items)

    return [
        {
            "gpu": g.gpu_index,
            "uuid": g.gpu_uuid,
            "model": g.model,
            "note": g.note,
            "memory_slices": g.memory_slices,
            "free_slices": list(g.free_slices),
            "fits_now": counts(g.fits_now),
            "profiles": [
                {
                    "profile": p.profile,
                    "placements": [
                        {
                            "start": o.start,
                            "size": o.size,
                            "recommended": o.recommended,
                            "largest_after": o.largest_after or None,
                            "fits_after": counts(o.fits_after),
                        }
                        for o in p.placements
                    ],
                    "recommended": next((o.start for o in p.placements if o.recommended), None),
                    "reason": p.reason,
                    "fragmented": p.fragmented,
                    "moves": [
                        {
                            "profile": m.profile,
                            "gpu_instance": m.gpu_instance_id,
                            "from_start": m.from_start,
                            "to_start": m.to_start,
                            "busy": m.busy,
                        }
                        for m in p.moves
                    ],
                    "start_after_moves": p.start_after_moves,
                }
                for p in g.profiles
            ],
        }
        for g in gpus
    ]


def _move_text(m: dict[str, Any]) -> str:
    busy = " (in use)" if m["busy"] else ""
    return f"the {m['profile']} at slice {m['from_start']}{busy} were at slice {m['to_start']}"


def _advice_table(data: list[dict[str, Any]]) -> str:
    blocks = []
    for g in data:
        # A GPU lost before the agent started has no model to name.
        head = f"GPU {g['gpu']}" + (f" ({g['model']})" if g["model"] else "")
        if g["note"]:
            blocks.append(f"{head}: {g['note']}: no placement advice")
            continue
        slices = g["free_slices"]
        # The count first: "free memory slices 7 of 8" read as seven free when slice 7 was.
        which = ",".join(map(str, slices)) or "none"
        free = f"{len(slices)} of {g['memory_slices']} free ({which})"
        rows, notes = [], []
        for p in g["profiles"]:
            best = next((o for o in p["placements"] if o["recommended"]), None)
            starts = " ".join(
                f"{o['start']}*" if o["recommended"] else str(o["start"]) for o in p["placements"]
            )
            after = " ".join(f"{k}:{n}" for k, n in (best or {}).get("fits_after", {}).items() if n)
            rows.append(
                [
                    p["profile"],
                    g["fits_now"].get(p["profile"], 0),
                    starts or "-",
                    "-" if best is None else best["start"],
                    (best or {}).get("largest_after") or "-",
                    after or ("nothing" if best else "-"),
                ]
            )
            if best is None:
                line = f"  {p['profile']}: {p['reason']}"
                if p["moves"]:
                    moves = " and ".join(_move_text(m) for m in p["moves"])
                    line += f"; it would fit at slice {p['start_after_moves']} if {moves}"
                notes.append(line)
        table = format_table(
            ["PROFILE", "FIT NOW", "FREE STARTS", "ADVISED", "LARGEST AFTER", "STILL FITS AFTER"],
            rows,
        )
        body = "\n".join("  " + line for line in table.splitlines())
        blocks.append("\n".join([f"{head}: memory slices {free}", body, *notes]))
    blocks.append(
        "* advised: keeps the largest profiles placeable (ties: lowest start). Nothing changed."
    )
    return "\n\n".join(blocks)


@click.command(
    "advise", short_help="Where the next instance of each profile should go (read only)."
)
@click.option("--gpu", "gpu_index", type=GPU_INDEX, default=None, help="Only GPU N.")
@click.option("--profile", default="", help="Only this GPU-instance profile, e.g. 3g.40gb.")
@output_option
@click.pass_obj
def advise_command(obj: CliContext, gpu_index: int | None, profile: str, output: str) -> None:
    """For each GPU and MIG profile: the free placements, what would still fit after each (per
    profile, how many more instances), and the advised one: the placement that keeps the
    largest profiles placeable, ties to the lowest start. A profile that does not fit is
    explained; when the free slices are only fragmented, the moves of existing instances that
    would fit it are named. Changes nothing, in every allocation mode: on nodes whose DRA driver
    makes MIG instances itself (dra-dynamic-mig) this advice is what the agent offers.

    \b
    Example:
      gpu-agent mig advise --gpu 0 --profile 3g.40gb
    """
    try:
        advice = obj.agent().advise_mig(gpu_index, profile)
    except InvalidSpec as exc:
        raise exc.renamed({"gpu_index": "gpu"}) from None
    data = _advice_data(advice)
    emit(data, output, _advice_table)
