"""bench/deploy_fleet.py reports each run as the median of its rounds with their spread (not the best round), and
docs/benchmarks.md's fleet table is in that form with numbers that agree with their own rounds."""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import deploy_fleet  # noqa: E402


def test_summary_gives_medians_spreads_and_ratios_of_the_medians() -> None:
    rounds = {"cli(50)": [4.27, 3.50, 3.67], "xargs(50)": [4.37, 3.77, 4.18], "cli(100)": [6.54, 6.72, 5.71]}
    assert deploy_fleet.summary(rounds) == [
        "median of the rounds (min-max; every round), seconds:",
        "  cli(50)        3.67 (3.50-4.27; 4.27, 3.50, 3.67)",
        "  xargs(50)      4.18 (3.77-4.37; 4.37, 3.77, 4.18)",
        "  cli(100)       6.54 (5.71-6.72; 6.54, 6.72, 5.71)",
        "cli(50) / xargs(50) = 0.88 of the medians; by round 0.93 (0.88-0.98; 0.98, 0.93, 0.88)  "
        "(target <= 1; and cli(50) <= 5 s quiet)",
        "cli(100) / cli(50) = 1.78 of the medians; by round 1.56 (1.53-1.92; 1.53, 1.92, 1.56)  (target <= 2.2)",
    ]
    assert "best" not in " ".join(deploy_fleet.summary(rounds))


def test_the_fleet_table_gives_each_median_with_the_rounds_it_comes_from() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    section = text[text.index("## Fleet swap over SSH"):]
    cells = re.findall(r"([\d.]+)(?: s)? \(([\d.]+)-([\d.]+); ([\d., ]+)\)", section.split("\n\n| run |")[1][:2000])
    assert len(cells) >= 8, cells
    for median, low, high, every in cells:
        values = [float(v) for v in every.split(", ")]
        assert float(median) == round(statistics.median(values), 2), (median, every)
        assert (float(low), float(high)) == (min(values), max(values)), (low, high, every)
    assert "best of the rounds" not in section
