#!/usr/bin/env python3
"""A deterministic stand-in for the synthesis model of `hearth memory synthesize`
(`--model cmd:python3 memory_scripted_model.py`): fixed outputs per stage, computed from the
prompt's INPUT JSON. The stage is the last argument; HEARTH_MEMORY_SCHEMA names the file of
the JSON Schema hearth asks the answer to satisfy, and every answer is checked against it
with jsonschema (an answer the schema refuses fails the run: the schemas must admit every
good answer). Environment knobs (set by the test):
  SCRIPT_REWRITE=1   the synthesize stage throws the old prose away (the gate must refuse)
  SCRIPT_DANGLE=1    the synthesize stage adds a [[link]] to nothing (link must unwrap it)
  SCRIPT_SECRET=1    extract answers a fact holding an API key (must be dropped)
  SCRIPT_KILL=stage:n  SIGKILL hearth at the n-th call of that stage (counted in SCRIPT_COUNT_DIR)
"""
import json
import os
import signal
import sys

import jsonschema

stage = sys.argv[-1]
prompt = sys.stdin.read()
data = json.loads(prompt.split("INPUT:\n", 1)[1])

kill = os.environ.get("SCRIPT_KILL", "")
if kill.startswith(stage + ":"):
    counter = os.path.join(os.environ["SCRIPT_COUNT_DIR"], stage)
    n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
    open(counter, "w").write(str(n))
    if n == int(kill.split(":")[1]):
        # the shell popen started is our parent; hearth is its parent
        shell = os.getppid()
        hearth = int(open(f"/proc/{shell}/stat").read().rsplit(")", 1)[1].split()[1])
        os.kill(hearth, signal.SIGKILL)
        sys.exit(1)

if stage == "segment":
    out = [{"topic": "all", "messages": [m["id"] for m in data["messages"]]}]
elif stage == "extract":
    out = [{"person": m["speaker"], "fact": m["text"].split("\n")[0], "messages": [m["id"]]} for m in data["messages"]
           if m["speaker"] in ("user", "Caroline")]
    if os.environ.get("SCRIPT_SECRET") and data["messages"]:
        out.append({"person": "user", "fact": "My OpenAI key is sk-abcdefghijklmnopqrstuvwxyz123456", "messages": [data["messages"][0]["id"]]})
elif stage == "route":
    fact = data["fact"].lower()
    out = {"article": "Cycling" if "bike" in fact else "Baking" if "sourdough" in fact or "bake" in fact else "Profile"}
elif stage == "synthesize":
    added = "\n\n".join(f"{f['fact']} {f['marker']}" for f in data["facts"])
    text = added if os.environ.get("SCRIPT_REWRITE") else (data["text"] + "\n\n" + added).strip()
    if os.environ.get("SCRIPT_DANGLE"):
        text += "\n\nSee also [[No Such Article]] and [[Profile]]."
    out = {"text": text}
else:
    sys.exit(f"scripted model: unknown stage {stage}")
schema = json.load(open(os.environ["HEARTH_MEMORY_SCHEMA"]))
jsonschema.Draft202012Validator.check_schema(schema)
jsonschema.validate(out, schema)
print("Sure! Here is the JSON:\n```json\n" + json.dumps(out) + "\n```")
