"""results_file.py: the one file a benchmark keeps in bench/results/ (`<name>.md`).

A result file is markdown a person reads: the title, one provenance line (the command that
made it, the machine, its load average, the date), the tables, and at the end the full
machine-readable result as a fenced json block under the heading "Machine-readable result".
write() makes such a file; read() returns the json block of one (tests and scripts that
compare with the previous run read results only through it). Standard library only: the
GPU machine runs these scripts with a bare python3.

From the shell (tools/, bench/*.sh):
  results_file.py write OUT.md --body BODY.md --json DATA.json [--command CMD]
  results_file.py json FILE.md          prints the json block (indented)
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")
JSON_HEADING = "## Machine-readable result"
_FENCE_OPEN, _FENCE_CLOSE = "```json", "```"


def path_of(name):
    """bench/results/<name>.md for a benchmark name; a path (with a '/' or '.md') is kept."""
    if os.sep in name or name.endswith(".md"):
        return name if name.endswith(".md") else name + ".md"
    return os.path.join(RESULTS, name + ".md")


def machine():
    """CPU model and logical core count (the GPU scripts pass their own machine line)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs"


def load_average():
    try:
        return "%.1f" % os.getloadavg()[0]
    except OSError:
        return None


def command_line(argv=None):
    """The command as typed from the repository root: the script path made relative."""
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.isabs(argv[0]) and argv[0].startswith(REPO + os.sep):
        argv[0] = os.path.relpath(argv[0], REPO)
    return " ".join(shlex.quote(a) for a in argv)


def provenance(command=None, machine_line=None, load=None, date=None):
    """The header line. Each field left None is measured now; pass a string to state it
    (converted or copied results say where their machine and date are written)."""
    command = command_line() if command is None else command
    machine_line = machine() if machine_line is None else machine_line
    load = load_average() if load is None else load
    if date is None:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"Made by `{command}` on {machine_line}; load average {load}; {date}."


def render(body, data, header):
    """The file's text: the body's title line, the header line, the rest of the body, the json."""
    body = body.strip("\n")
    lines = body.split("\n")
    if lines and lines[0].startswith("# "):
        title, rest = lines[0], "\n".join(lines[1:]).strip("\n")
    else:
        title, rest = None, body
    parts = ([title] if title else []) + [header] + ([rest] if rest else [])
    text = "\n\n".join(parts)
    blob = json.dumps(data, indent=1, ensure_ascii=False)
    return f"{text}\n\n{JSON_HEADING}\n\n{_FENCE_OPEN}\n{blob}\n{_FENCE_CLOSE}\n"


def write(name, body, data, *, command=None, machine_line=None, load=None, date=None):
    """Writes bench/results/<name>.md (or the path `name`): body is the markdown of the run
    (a '# title' first line stays first), data the full result. Returns the path."""
    path = path_of(name)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = render(body, data, provenance(command, machine_line, load, date))
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def rewrite(name, body, data):
    """Writes the file again with new tables or json but its header line as it is: for scripts
    that re-render a stored result or add a section to it (what the header names made the rest)."""
    path = path_of(name)
    with open(path, encoding="utf-8") as f:
        head = next((l for l in f.read().split("\n")[:3] if l.startswith("Made by `")), None)
    if head is None:
        return write(name, body, data)
    text = render(body, data, head)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path


def write_section(name, title, heading, section, key, data):
    """Writes one section of a results file that several benchmarks share: `section` (markdown
    whose first line is `heading`, a "## " line, with its own provenance line) replaces the
    section under that heading (up to the next "## " heading), or is added at the end;
    data goes into the json block under `key`, the other keys kept. A new file gets `title`
    (a "# " line). Returns the path."""
    path = path_of(name)
    doc, md = {}, title.rstrip("\n") + "\n"
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if ("\n" + JSON_HEADING + "\n") in text:
            doc = parse(text, path)
            text = text[:text.rfind("\n" + JSON_HEADING + "\n")]
        md = text.rstrip("\n") + "\n"
    section = section.strip("\n") + "\n"
    at = md.find("\n" + heading + "\n")
    if at >= 0:
        nxt = md.find("\n## ", at + 1 + len(heading))
        md = md[:at + 1] + section + (md[nxt:] if nxt >= 0 else "")
    else:
        md = md + "\n" + section
    doc[key] = data
    blob = json.dumps(doc, indent=1, ensure_ascii=False)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{md.rstrip()}\n\n{JSON_HEADING}\n\n{_FENCE_OPEN}\n{blob}\n{_FENCE_CLOSE}\n")
    os.replace(tmp, path)
    return path


def write_keeping(name, body, data, sections):
    """write(name, body, data), then the sections (heading, json key) that other runs wrote into
    the previous file (write_section) put back as they were: a run of the file's main benchmark
    replaces its own part only. Returns the path."""
    kept = []
    if os.path.exists(path_of(name)):
        doc, text = read(name), body_of(name)
        for heading, key in sections:
            at = text.find("\n" + heading + "\n")
            if at >= 0 and key in doc:
                end = text.find("\n## ", at + 1 + len(heading))
                kept.append((heading, text[at + 1:end if end >= 0 else len(text)], key, doc[key]))
    path = write(name, body, data)
    for heading, section, key, value in kept:
        write_section(name, "", heading, section, key, value)
    return path


def parse(text, where="<text>"):
    """The json block after the last "Machine-readable result" heading of a result file's text."""
    at = text.rfind("\n" + JSON_HEADING + "\n")
    if at < 0:
        raise ValueError(f"{where}: no '{JSON_HEADING}' section (not a bench/results file?)")
    lines = text[at:].split("\n")
    try:
        start = lines.index(_FENCE_OPEN) + 1
        end = lines.index(_FENCE_CLOSE, start)
    except ValueError:
        raise ValueError(f"{where}: the '{JSON_HEADING}' section has no closed ```json block") from None
    try:
        return json.loads("\n".join(lines[start:end]))
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: the json block does not parse: {e}") from None


def read(name):
    """The machine-readable result of bench/results/<name>.md (or of the path `name`)."""
    path = path_of(name)
    with open(path, encoding="utf-8") as f:
        return parse(f.read(), path)


def read_if_exists(name, default=None):
    """read(), or default when the file is not there (a first run)."""
    return read(name) if os.path.exists(path_of(name)) else default


def body_of(name):
    """The markdown of a result file without its header line and json section (for scripts
    that rewrite one section and keep the rest)."""
    with open(path_of(name), encoding="utf-8") as f:
        text = f.read()
    at = text.rfind("\n" + JSON_HEADING + "\n")
    text = text[:at] if at >= 0 else text
    lines = text.split("\n")
    for i, line in enumerate(lines[:3]):  # the header line: after the title, or first
        if line.startswith("Made by `"):
            del lines[i : i + 2 if i + 1 < len(lines) and not lines[i + 1] else i + 1]
            break
    return "\n".join(lines).strip("\n") + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write OUT.md from a markdown body and a json file")
    w.add_argument("out")
    w.add_argument("--body", required=True, help="markdown of the run (its '# title' line first)")
    w.add_argument("--json", required=True, help="the full result, a json file")
    w.add_argument("--command", help="the command that made it (default: this command line)")
    w.add_argument("--machine", help="the machine (default: this machine's CPU)")
    w.add_argument("--load", help="the load average (default: now)")
    w.add_argument("--date", help="the date (default: now, UTC)")
    j = sub.add_parser("json", help="print the json block of a result file")
    j.add_argument("file")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "write":
            with open(a.body, encoding="utf-8") as f:
                body = f.read()
            with open(a.json, encoding="utf-8") as f:
                data = json.load(f)
            print(write(a.out, body, data, command=a.command, machine_line=a.machine, load=a.load, date=a.date))
        else:
            print(json.dumps(read(a.file), indent=1, ensure_ascii=False))
    except (OSError, ValueError) as e:
        sys.exit(f"results_file.py: {e}")


if __name__ == "__main__":
    main()
