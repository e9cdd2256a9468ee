#!/usr/bin/env bash
# Checks that the documents are true of this commit:
#   * every repository path README.md and docs/*.md name (in `code` or a link) exists;
#   * every `hookgate …` subcommand they show is one the binary accepts;
#   * docs/design.md's file map names every file under src/ (and, by the first check,
#     names no file that does not exist).
# Usage: scripts/check-docs.sh   (builds the debug binary). Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --bin hookgate
bin="${CARGO_TARGET_DIR:-target}/debug/hookgate"
python3 - "$bin" <<'PY'
import glob, os, re, subprocess, sys

binary = sys.argv[1]
docs = ["README.md"] + sorted(glob.glob("docs/*.md"))
problems = []

# Repository paths: a top-level folder of the project, then a path.
path_re = re.compile(r"(?<![\w/.~-])((?:src|tests|benches|scripts|config|deploy|docs|\.ci)/[\w./*-]*)")
link_re = re.compile(r"\]\(([^)#\s]+)")
for doc in docs:
    text = open(doc, encoding="utf-8").read()
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    named = set()
    for span in spans:
        named.update(path_re.findall(span))
    for target in link_re.findall(text):
        if "://" in target:
            continue
        named.add(os.path.normpath(os.path.join(os.path.dirname(doc), target)))
    for path in sorted(named):
        path = path.rstrip(".,;:")
        if not glob.glob(path):
            problems.append(f"{doc}: names {path}, which does not exist")

# Subcommands: `hookgate a [b]` and `cargo run ... -- a [b]`.
def helps(words):
    run = subprocess.run([binary, *words, "--help"], capture_output=True, text=True)
    return run.returncode == 0, run.stdout

def subcommands(help_text):
    names, inside = set(), False
    for line in help_text.splitlines():
        if line.startswith("Commands:"):
            inside = True
        elif inside and line.startswith("  "):
            names.add(line.split()[0])
        elif inside and line.strip():
            inside = False
    return names

cmd_re = re.compile(r"(?:\bhookgate|cargo run(?: --release)? --)\s+([a-z][a-z-]*)(?:\s+([a-z][a-z-]*))?")
checked = set()
for doc in docs:
    text = open(doc, encoding="utf-8").read()
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    for span in spans:
        for first, second in cmd_re.findall(span):
            if (first, second) in checked:
                continue
            checked.add((first, second))
            ok, help_text = helps([first])
            if not ok:
                problems.append(f"{doc}: shows `hookgate {first}`, which the binary does not accept")
                continue
            nested = subcommands(help_text)
            if nested and second and second not in nested:
                problems.append(f"{doc}: shows `hookgate {first} {second}`, not one of {sorted(nested)}")

# The design map: every file under src/ has its row.
design = open("docs/design.md", encoding="utf-8").read()
for path in sorted(glob.glob("src/**/*", recursive=True)):
    if os.path.isfile(path) and f"`{path}`" not in design:
        problems.append(f"docs/design.md: the file map has no row for {path}")

for problem in problems:
    print(problem, file=sys.stderr)
print(f"check-docs: {len(docs)} documents, {len(checked)} commands checked, {len(problems)} problems")
sys.exit(1 if problems else 0)
PY
