#!/usr/bin/env python3
"""make_agent_trace.py: writes tests/api/data/agent_trace.json, the coding-agent trace that
tests/api/test_agent_trace.py replays against `hearth serve`. It is synthetic but shaped
like a coding agent's traffic (Claude Code, Codex, pi): three sessions interleaved, each a
long fixed system prompt with tool descriptions and a conversation that grows by one
assistant reply and one user message or tool result per request, and after each session's
first message a short side request that asks for a title (a different system prompt, not
part of the conversation). Deterministic: the same file every run.
Usage: tools/make_agent_trace.py [OUT]"""
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "api" / "data" / "agent_trace.json"
TOOLS = {
    "read_file": "Reads a file of the workspace. Arguments: path (string), offset and limit in lines.",
    "write_file": "Writes a whole file. Arguments: path (string), content (string). Overwrites.",
    "edit_file": "Replaces one exact occurrence of old_text by new_text in a file. Fails when absent.",
    "bash": "Runs a shell command in the workspace with a timeout; returns stdout, stderr and the exit status.",
    "grep": "Searches files for a regular expression; returns matching lines with their paths and numbers.",
    "list_dir": "Lists a folder's entries with their kinds and sizes.",
}
RULES = ["Read the code before changing it.", "Prefer small, reviewable edits.", "Run the tests after each change.",
         "Never invent file contents; read them.", "Explain what you did in one short paragraph at the end.",
         "Ask before deleting files.", "Keep the user's style and formatting.", "Report failures honestly."]
TASKS = ["Fix the failing test in tests/test_parser.py: the tokenizer drops a trailing newline.",
         "Add a --verbose flag to the CLI that prints each step and document it in the README.",
         "The server leaks a file descriptor per request under load; find the leak and fix it."]
FILES = ["src/parser.c", "src/cli.c", "src/server.c", "tests/test_parser.py", "README.md", "Makefile"]


NOTES = ["Use it when the task needs it and not otherwise.", "Paths are relative to the working directory.",
         "Large outputs are truncated; narrow the request instead of repeating it.",
         "Errors come back as the tool result; read them before retrying.",
         "Do not call it in a loop without progress; explain what you learned first.",
         "Prefer it over asking the user when the answer is in the repository."]
AREAS = ["tests", "builds", "git", "formatting", "dependencies", "documentation", "security", "performance"]


def system_prompt():
    """About 4k tokens, like a coding agent's instructions and tool schemas (Claude Code's
    are larger still)."""
    lines = ["You are a coding agent working in the user's repository. You act through tools.", "", "# Tools"]
    for name, desc in TOOLS.items():
        lines += [f"## {name}", desc, "Parameters are a JSON object; unknown keys are refused."]
        lines += [f"- {n}" for n in NOTES]
    lines += ["", "# Rules"] + [f"{i + 1}. {r}" for i, r in enumerate(RULES)]
    for area in AREAS:
        lines += ["", f"# On {area}"] + [f"- When the work touches {area}: {r[0].lower() + r[1:]}" for r in RULES]
    lines += ["", "# Environment", "Working directory: /home/user/project", "Platform: linux", "Shell: bash"]
    return "\n".join(lines)


def code_block(rng, lines):
    words = ["int", "return", "buf", "len", "if", "for", "size_t", "char", "parse", "next", "error", "free"]
    return "\n".join("    " + " ".join(rng.choice(words) for _ in range(rng.randrange(3, 9))) + ";"
                     for _ in range(lines))


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    rng = random.Random(39)
    system = system_prompt()
    sessions = []
    for s, task in enumerate(TASKS):
        turns = []  # the messages each request adds after the previous request's assistant reply
        for t in range(7):
            path = rng.choice(FILES)
            if t == 0:
                turns.append({"role": "user", "content": task})
            elif t % 2:
                turns.append({"role": "user", "content": f"Tool result (read_file {path}):\n{code_block(rng, 12)}"})
            else:
                turns.append({"role": "user", "content": f"Tool result (bash make test): exit {rng.choice([0, 1, 2])}\n"
                                                         f"{code_block(rng, 4)}"})
        replies = [f"I will {rng.choice(['read', 'inspect', 'check', 'edit'])} {rng.choice(FILES)} next. "
                   f"{code_block(rng, 2)}" for _ in range(7)]
        sessions.append({"turns": turns, "replies": replies})
    requests = []
    for t in range(7):  # round-robin over sessions: their requests interleave
        for s, sess in enumerate(sessions):
            msgs = [{"role": "system", "content": system}]
            for k in range(t + 1):
                msgs.append(sess["turns"][k])
                if k < t:
                    msgs.append({"role": "assistant", "content": sess["replies"][k]})
            requests.append({"session": s, "kind": "turn", "turn": t, "messages": msgs})
            if t == 0:
                requests.append({"session": s, "kind": "title", "turn": 0, "messages": [
                    {"role": "system", "content": "Write a 3-7 word title for the conversation. Reply with the title only."},
                    {"role": "user", "content": sess["turns"][0]["content"]}]})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"made_by": "tools/make_agent_trace.py", "requests": requests}, indent=1) + "\n")
    print(f"{out}: {len(requests)} requests")


if __name__ == "__main__":
    main()
