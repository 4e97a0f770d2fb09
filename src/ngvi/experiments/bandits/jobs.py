"""How the bandits experiment names its problems and jobs: shared by the experiment and its report (which
reads the finished jobs back by these keys), so that neither imports the other for them."""

from __future__ import annotations

__all__ = ["job_key", "problems"]


def problems(datasets: list[str], deltas: list[float]) -> list[tuple[str, str, float | None]]:
    """(problem key, data set, δ): the wheel expands into one problem per δ."""
    out: list[tuple[str, str, float | None]] = []
    for name in datasets:
        if name == "wheel":
            out += [(f"wheel_{d:g}", "wheel", d) for d in deltas]
        else:
            out.append((name, name, None))
    return out


def job_key(problem: str, contexts: int | None, agent: str, run: int) -> str:
    return f"{problem}/{contexts if contexts is not None else 'all'}/{agent}/{run}"
