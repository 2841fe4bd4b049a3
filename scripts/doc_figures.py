#!/usr/bin/env python3
"""The figures the README and docs state for the default runs, checked against what the code gives.

Where a page states a figure, an HTML comment right after the value names it (invisible once the
Markdown is rendered): `τ 2.127<!--fig:testbed.tau-->`. A run's metrics file gives the values:

  doc_figures.py check RUN METRICS   every figure of RUN stated in the docs equals the run's value
                                     at the precision the page states it (exit 1 naming each one
                                     that does not)
  doc_figures.py write RUN METRICS   writes the run's values into the pages instead
  doc_figures.py list                every marked figure: page, line, name, value
  doc_figures.py corpus TESTBED_JSON  exit 1, naming the difference, when the testbed's corpus
                                     (testbed.json of make_testbed_target.py) is not the one the
                                     docs state (testbed.python, testbed.corpus_bytes): the
                                     testbed figures hold for that corpus only

RUN is `testbed` (configs/testbed-dspine.yaml as scripts/train.sh runs it; ctest testbed_figures)
or `tiny` (configs/tiny.yaml, the embedded default; ctest tiny_config_trains). Figures that are
measurements of time or size are written by the scripts that measure them, not checked here.
"""
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
# Facts of the testbed's corpus, checked by `corpus` rather than read from a run's metrics.
CORPUS_FIGURES = {"testbed.python", "testbed.corpus_bytes"}
MARK = re.compile(r"(?P<value>-?[0-9][0-9,]*(?:\.[0-9]+)*)(?P<unit>%?)<!--fig:(?P<name>[a-z0-9_.]+)-->")


def last_eval(metrics_path):
    """The run's last record holding an evaluation, as {name: value} without the eval/ prefix."""
    records = [json.loads(line) for line in open(metrics_path) if line.strip()]
    evals = [r for r in records if "eval/tau" in r]
    if not evals:
        sys.exit(f"doc_figures: {metrics_path} holds no evaluation (eval/tau)")
    last = evals[-1]
    values = {k[len("eval/"):]: v for k, v in last.items() if k.startswith("eval/")}
    values["step"] = last["step"]
    return values


def figures_of(run, ev):
    """name -> value of every figure a run gives (percentages as percent)."""
    out = {f"{run}.{key}": ev[key] for key in ("tau", "tau_refine", "tau_sampled", "accuracy",
                                                "blocks", "step") if key in ev}
    for key, value in ev.items():
        if key.startswith("accept_"):
            out[f"{run}.{key}"] = 100.0 * value
    return out


def stated(text):
    for match in MARK.finditer(text):
        yield match


def formatted(value, like):
    """`value` written as the page writes `like`: the same number of decimals, thousands commas."""
    decimals = len(like.split(".")[1]) if "." in like else 0
    text = f"{value:,.{decimals}f}" if "," in like else f"{value:.{decimals}f}"
    return text


def stated_values(name):
    """Every value the pages state for figure `name`."""
    return {m["value"] for page in PAGES for m in stated((ROOT / page).read_text())
            if m["name"] == name}


def check_corpus(testbed_json):
    about = json.load(open(testbed_json))
    mine = {"testbed.python": about["python"],
            "testbed.corpus_bytes": f"{about['corpus']['bytes']:,}"}
    differ = [f"{name}: the docs state {sorted(stated_values(name))}, this machine has {value}"
              for name, value in mine.items() if stated_values(name) != {value}]
    if differ:
        print("the testbed figures are stated for another corpus:\n  " + "\n  ".join(differ))
        return 1
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "corpus":
        return check_corpus(argv[2])
    if len(argv) == 2 and argv[1] == "list":
        for page in PAGES:
            for n, line in enumerate((ROOT / page).read_text().splitlines(), 1):
                for m in stated(line):
                    print(f"{page}:{n}: {m['name']} = {m['value']}{m['unit']}")
        return 0
    if len(argv) != 4 or argv[1] not in ("check", "write"):
        sys.exit(__doc__)
    mode, run, metrics = argv[1:]
    values = figures_of(run, last_eval(metrics))
    wrong, found = [], 0
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()

        def replace(m):
            nonlocal found
            name = m["name"]
            if not name.startswith(run + ".") or name in CORPUS_FIGURES:
                return m.group(0)
            if name not in values:
                wrong.append(f"{page}: {name}: the {run} run gives no such figure")
                return m.group(0)
            found += 1
            want = formatted(values[name], m["value"])
            if want != m["value"]:
                wrong.append(f"{page}: {name} is {m['value']}{m['unit']} there, the code gives "
                              f"{want}{m['unit']} ({values[name]!r})")
            return f"{want}{m['unit']}<!--fig:{name}-->"

        new = MARK.sub(replace, text)
        if mode == "write" and new != text:
            path.write_text(new)
    if found == 0:
        wrong.append(f"no page states a figure of the {run} run (<!--fig:{run}.…-->)")
    if mode == "check" and wrong:
        print("\n".join(f"FAIL: {w}" for w in wrong))
        print(f"(record the code's figures with: scripts/doc_figures.py write {run} METRICS)")
        return 1
    print(f"{run}: {found} figures {'written' if mode == 'write' else 'as stated'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
