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
def client(smollm2_server):
    return openai.OpenAI(base_url=smollm2_server + "/v1", api_key="none")


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_chat_json_schema_validates(client, i):
    schema = SCHEMAS[i]
    r = client.chat.completions.create(
        model="default_model", max_tokens=200, temperature=0.8, seed=i,
        messages=[{"role": "user", "content": "Answer with JSON only. " + json.dumps(schema)}],
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text  # the grammar ended it, not max_tokens
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_chat_json_object(client):
    r = client.chat.completions.create(model="default_model", max_tokens=120, temperature=0.7, seed=3,
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
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format", "keyword 'not' is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/no"}}}},
     "response_format", "points at nothing"),
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
