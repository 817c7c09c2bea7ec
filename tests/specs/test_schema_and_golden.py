"""The checked-in JSON Schemas match the models; golden vectors decode as they say."""

import json
from pathlib import Path

import jsonschema
import pytest

from dynlogits.specs import SpecError, decode_wire_payload, encode_entries
from dynlogits.specs.schema import PAYLOAD_SCHEMA_FILE, SPEC_SCHEMA_FILE, golden_vectors, payload_schema, render, spec_schema

SPECS_DIR = Path(__file__).resolve().parents[2] / "specs"
VECTORS = golden_vectors()


@pytest.mark.parametrize(("filename", "build"), [(PAYLOAD_SCHEMA_FILE, payload_schema), (SPEC_SCHEMA_FILE, spec_schema)])
def test_checked_in_schema_matches_the_models(filename, build):
    checked_in = (SPECS_DIR / filename).read_text()
    assert checked_in == render(build()), f"specs/{filename} is stale: run `dynlogits schema{' --spec' if 'spec.' in filename else ''} > specs/{filename}`"


def test_golden_vectors_cover_valid_and_invalid_payloads():
    assert sum(v["valid"] for _, v in VECTORS) >= 3
    assert sum(not v["valid"] for _, v in VECTORS) >= 10


@pytest.mark.parametrize(("name", "vector"), VECTORS, ids=[n for n, _ in VECTORS])
def test_golden_vector_decodes_as_it_says(name, vector):
    if vector["valid"]:
        entries = decode_wire_payload(vector["payload"])
        assert [e.kind for e in entries] == [item["kind"] for item in vector["payload"]]
        assert decode_wire_payload(encode_entries(entries)) == entries
    else:
        with pytest.raises(SpecError) as info:
            decode_wire_payload(vector["payload"])
        assert [str(p) for p in info.value.problems] == vector["errors"]


@pytest.mark.parametrize(("name", "vector"), [(n, v) for n, v in VECTORS if v["valid"]], ids=[n for n, v in VECTORS if v["valid"]])
def test_valid_golden_vectors_satisfy_the_published_schema(name, vector):
    schema = json.loads((SPECS_DIR / PAYLOAD_SCHEMA_FILE).read_text())
    jsonschema.validate(vector["payload"], schema)
