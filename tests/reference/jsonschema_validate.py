"""Validates documents generated under JSON Schema grammars (test_grammar_vocabulary).

Usage: jsonschema_validate.py FILE, where FILE holds one JSON object a line: {"name": ...,
"schema": ..., "document": "generated text"}. Each document must parse as JSON and validate
against its schema under Draft 2020-12 with formats checked. OpenAPI's `nullable: true`, which the
grammar supports and JSON Schema does not know, is rewritten as an anyOf with null first. Prints
one line per failure and exits 1 if any; prints the count of valid documents otherwise.
"""
import json
import sys

import jsonschema


def without_nullable(schema):
    if isinstance(schema, list):
        return [without_nullable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rewritten = {key: without_nullable(value) for key, value in schema.items()}
    if rewritten.pop("nullable", False):
        defs = {k: rewritten.pop(k) for k in ("$defs", "definitions") if k in rewritten}
        return {"anyOf": [rewritten, {"type": "null"}], **defs}
    return rewritten


def main():
    failures = 0
    valid = 0
    with open(sys.argv[1], encoding="utf-8") as lines:
        for line in lines:
            case = json.loads(line)
            schema = without_nullable(case["schema"])
            validator = jsonschema.Draft202012Validator(
                schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
            try:
                document = json.loads(case["document"])
            except ValueError as error:
                print(f"{case['name']}: not JSON ({error}): {case['document']!r}")
                failures += 1
                continue
            errors = list(validator.iter_errors(document))
            if errors:
                print(f"{case['name']}: {errors[0].message}: {case['document']!r}")
                failures += 1
            else:
                valid += 1
    print(f"{valid} documents valid, {failures} invalid")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
