"""BADAM Table 1: cumulative reward normalised by the optimal reward, mean ± one std over 10 runs.

Transcribed from the paper (papers/002, Table 1). Columns are our data-set keys; rows are the paper's agent
names (``AgentSpec.published``). The paper ran every data set in full (covertype and census: 10,000 points).
"""

from __future__ import annotations

#: data-set key -> the paper's column name
COLUMNS = {
    "mushroom": "Mushroom",
    "financial": "Financial",
    "jester": "Jester",
    "statlog": "Statlog",
    "adult": "Adult",
    "covertype": "Covertype",
    "census": "Census",
}

#: paper row -> data-set key -> (mean, std)
BADAM_TABLE1: dict[str, dict[str, tuple[float, float]]] = {
    "BADAM": {
        "mushroom": (0.74, 0.09),
        "financial": (0.74, 0.03),
        "jester": (0.48, 0.01),
        "statlog": (0.97, 0.02),
        "adult": (0.13, 0.01),
        "covertype": (0.58, 0.01),
        "census": (0.36, 0.06),
    },
    "MC DROPOUT": {
        "mushroom": (0.68, 0.11),
        "financial": (0.68, 0.02),
        "jester": (0.48, 0.01),
        "statlog": (0.96, 0.02),
        "adult": (0.13, 0.01),
        "covertype": (0.57, 0.01),
        "census": (0.44, 0.03),
    },
    "BBB": {
        "mushroom": (0.60, 0.15),
        "financial": (0.21, 0.13),
        "jester": (0.46, 0.02),
        "statlog": (0.71, 0.17),
        "adult": (0.10, 0.04),
        "covertype": (0.39, 0.06),
        "census": (0.38, 0.02),
    },
    "VADAM": {
        "mushroom": (0.76, 0.03),
        "financial": (0.81, 0.00),
        "jester": (0.48, 0.01),
        "statlog": (0.99, 0.00),
        "adult": (0.26, 0.02),
        "covertype": (0.74, 0.01),
        "census": (0.65, 0.00),
    },
    "Greedy": {
        "mushroom": (0.64, 0.18),
        "financial": (0.86, 0.03),
        "jester": (0.50, 0.01),
        "statlog": (0.97, 0.03),
        "adult": (0.16, 0.01),
        "covertype": (0.62, 0.03),
        "census": (0.44, 0.02),
    },
    "Uniform": {
        "mushroom": (-0.93, 0.09),
        "financial": (-0.01, 0.01),
        "jester": (0.34, 0.00),
        "statlog": (0.14, 0.00),
        "adult": (0.07, 0.00),
        "covertype": (0.14, 0.00),
        "census": (0.11, 0.00),
    },
}

#: the number of contexts the paper used per data set ("the full datasets ... apart from the Census and
#: Covertype datasets ... a subset of n = 10000"): our files' sizes for the sets we hold
PAPER_CONTEXTS = {"mushroom": 8124, "statlog": 43500, "adult": 45222, "covertype": 10000, "census": 10000}
