"""Constrained decoding through the real openai SDK: response_format json_schema (chat and
Responses text.format), json_object, llama-server's grammar / regex fields on completions;
the output must parse and validate with `jsonschema` (an independent validator), match
the regex with Python's `re`, and a bad schema / grammar must be a 400 naming the problem.
The schemas cover the categories real schemas use (nested objects, enums, arrays with
bounds, numeric bounds, patterns, $ref/$defs, anyOf, optional properties)."""
import json
import re

import jsonschema
import pytest

openai = pytest.importorskip("openai")

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}},
     "required": ["color", "hex"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"]}},
     "required": ["ok"], "additionalProperties": False},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                      "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
     "required": ["a", "b"], "additionalProperties": False},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                "required": ["kind", "lives"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
                "required": ["kind", "good"], "additionalProperties": False}]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "minLength": 1,
                                                                           "maxLength": 8}, "maxItems": 3},
                                      "score": {"type": "number", "minimum": 0}},
     "required": ["tags", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"date": {"type": "string", "format": "date"},
                                      "id": {"type": "string", "format": "uuid"}},
     "required": ["date", "id"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def fast_server(smollm2):
    """The fast kernels: no check here compares a golden (they are jsonschema's, the regex's
    or the error's), and the reference kernels decode SmolLM2 about ten times slower (prompt
    processing fifty times). The sampled texts differ between AVX2 and AVX-512, so every
    request on this server passed on both (HEARTH_CPU=avx2 / avx512); a change of the fast
    kernels' rounding can change them too."""
    from conftest import server
    with server(smollm2) as base:
        yield base


@pytest.fixture(scope="module")
def client(fast_server):
    return openai.OpenAI(base_url=fast_server + "/v1", api_key="none")


@pytest.fixture(scope="module")
def reference_client(smollm2_server):
    """The reference kernels, the same text on every CPU: for a request whose answer is not
    bounded by its format (any JSON object), which on the AVX2 kernels ran past max_tokens."""
    return openai.OpenAI(base_url=smollm2_server + "/v1", api_key="none")


# Schemas whose answer is unbounded (a free string): where it ends is the sampled text's
# choice, which on the SIMD kernels moves with any change of rounding (a speculative step
# scores its rows in one matrix product, so what lookup or the grammar proposes changes it):
# they run on the reference kernels, the same text with or without speculation.
UNBOUNDED = {3}


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_chat_json_schema_validates(request, i):
    client = request.getfixturevalue("reference_client" if i in UNBOUNDED else "client")
    schema = SCHEMAS[i]
    r = client.chat.completions.create(
        model="default_model", max_tokens=200, temperature=0.8, seed=i,
        messages=[{"role": "user", "content": "Answer with JSON only. " + json.dumps(schema)}],
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text  # the grammar ended it, not max_tokens
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_chat_json_object(reference_client):
    r = reference_client.chat.completions.create(model="default_model", max_tokens=120, temperature=0.7, seed=3,
                                       messages=[{"role": "user", "content": "Give me a JSON object about Paris."}],
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_chat_stream_json_schema(client):
    schema = SCHEMAS[0]
    chunks = client.chat.completions.create(
        model="default_model", max_tokens=120, stream=True, seed=1,
        messages=[{"role": "user", "content": "A person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)


def test_responses_text_format(client):
    schema = SCHEMAS[1]
    r = client.responses.create(model="default_model", input="Pick a color as JSON.", max_output_tokens=100,
                                text={"format": {"type": "json_schema", "name": "c", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"  # the requested format is echoed


def test_completions_regex_and_grammar(client):
    # the constraint holds for the generated text; completions show it without its first
    # leading space (mlx_lm.server's streaming detokenizer trims it), hence " ?"
    r = client.completions.create(model="default_model", prompt="The capital of France is", max_tokens=20,
                                  extra_body={"regex": " [A-Z][a-z]+\\."})
    assert re.fullmatch(r" ?[A-Z][a-z]+\.", r.choices[0].text), r.choices[0].text
    r = client.completions.create(model="default_model", prompt="Count:", max_tokens=30,
                                  extra_body={"grammar": 'root ::= " " num ("," num){2}\nnum ::= [1-9]'})
    assert re.fullmatch(r" ?[1-9](,[1-9]){2}", r.choices[0].text), r.choices[0].text


@pytest.mark.parametrize("body,field,needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strng"}}}},
     "response_format", "unknown type 'strng'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"pattern": "a"}}}}},
     "response_format", "keyword 'pattern' inside 'not' is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number",
                                                                                         "multipleOf": 0.3333}}}},
     "response_format", "multipleOf 0.3333: a fractional step must be a decimal"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/no"}}}},
     "response_format", "points at nothing"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format", "accepts no output at all"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "required": ["a"], "properties": {"a": False}}}}}, "response_format", "accepts no output at all"),
    ({"grammar": "root ::= foo"}, "grammar", "undefined rule 'foo'"),
    ({"regex": "(a"}, "regex", "unbalanced"),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
    ({"regex": "a", "grammar": "root ::= \"a\""}, "regex", "only one of"),
])
def test_bad_constraint_is_400(client, body, field, needle):
    with pytest.raises(openai.BadRequestError) as ex:
        client.chat.completions.create(model="default_model", max_tokens=5,
                                       messages=[{"role": "user", "content": "hi"}], extra_body=body)
    err = ex.value.body
    assert err["param"] == field
    assert needle in err["message"], err["message"]


# ---- 50 real-world schemas from MaskBench (JSONSchemaBench), every category ---------------

MASKBENCH_STRIDE = 20  # every 20th schema of the sorted dev set: 110 candidates, 20 categories
MASKBENCH_MIN_VALID = 50


def maskbench_category(name):
    """'Github_easy---o1008' -> 'Github_easy'; 'BFCL_simple_111' -> 'BFCL_simple'."""
    return name.split("---")[0] if "---" in name else name.rsplit("_", 1)[0]


def strict_form(schema):
    """The schema as strict-mode clients send it (the OpenAI SDK's to_strict_json_schema,
    pydantic): an object that lists its properties takes no others. Without it a 135M model
    invents keys until max_tokens. Every instance of this form is an instance of the
    original, which is what the answers are validated against. Objects that require a
    property they do not list, use patternProperties, or sit in allOf are left open."""
    if isinstance(schema, dict):
        props = schema.get("properties")
        if (isinstance(props, dict) and "additionalProperties" not in schema and "patternProperties" not in schema
                and "allOf" not in schema and all(r in props for r in schema.get("required", []))):
            schema["additionalProperties"] = False
        if "allOf" in schema:
            return schema
        for key, value in schema.items():
            if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                for sub in value.values():
                    strict_form(sub)
            elif key in ("anyOf", "oneOf", "prefixItems", "items") and isinstance(value, list):
                for sub in value:
                    strict_form(sub)
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                strict_form(value)
    return schema


@pytest.fixture(scope="module")
def maskbench_schemas(tmp_path_factory):
    import copy
    import sys
    import tarfile
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "maskbench"))
    import maskbench  # the data set is found the way the MaskBench bench finds it
    tar = Path(maskbench.shared_data()) / "maskbench-dev.tar.xz"
    if not tar.exists():
        pytest.skip(f"{tar} not found (set HEARTH_SHARED_DATA to the shared data folder)")
    tmp = tmp_path_factory.mktemp("maskbench")
    with tarfile.open(tar) as t:
        t.extractall(tmp, filter="data")
    folder = tmp / "maskbench-dev"
    by_category = {}
    for f in sorted(folder.glob("*.json"))[::MASKBENCH_STRIDE]:
        schema = json.loads(f.read_text())["schema"]
        by_category.setdefault(maskbench_category(f.stem), []).append(
            (f.stem, schema, strict_form(copy.deepcopy(schema))))
    # round-robin over the categories, so that the first answers already span them all
    queues = list(by_category.values())
    return [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]


@pytest.fixture(scope="module")
def fast_client(fast_server):
    return openai.OpenAI(base_url=fast_server + "/v1", api_key="none", max_retries=0)


def test_maskbench_schemas_validate(fast_client, maskbench_schemas):
    """Every answer that ends validates against its schema (jsonschema, formats checked);
    a schema hearth refuses is a 400 naming response_format and the keyword; at least 50
    schemas from at least 8 categories come back complete and valid. Answers cut by
    max_tokens (a small model rambling inside a long string) are counted, not judged.
    Candidates stop being sent once 50 answers validated."""
    import concurrent.futures
    import threading
    lock, valid = threading.Lock(), []

    def ask(case):
        name, schema, strict = case
        with lock:
            if len(valid) >= MASKBENCH_MIN_VALID:
                return name, "not sent", None
        try:
            r = fast_client.chat.completions.create(
                model="default_model", max_tokens=128, frequency_penalty=1.0, presence_penalty=0.5,
                messages=[{"role": "user", "content": "Reply with an example JSON document."}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "s", "schema": strict, "strict": True}})
        except openai.BadRequestError as e:
            return name, "refused", e.body
        choice = r.choices[0]
        if choice.finish_reason == "length":
            return name, "cut", None
        assert choice.finish_reason == "stop", (name, choice)
        jsonschema.validate(json.loads(choice.message.content), schema, format_checker=jsonschema.FormatChecker())
        with lock:
            valid.append(name)
        return name, "valid", None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # one batch: continuous batching
        results = list(pool.map(ask, maskbench_schemas))
    for name, verdict, body in results:
        if verdict == "refused":
            assert body["param"] == "response_format", (name, body)
            assert body["message"].startswith("response_format: json schema: "), (name, body)
    categories = {maskbench_category(name) for name in valid}
    counts = {v: sum(1 for _, x, _ in results if x == v) for v in ("valid", "cut", "refused")}
    assert len(valid) >= MASKBENCH_MIN_VALID, counts
    assert len(categories) >= 8, categories
