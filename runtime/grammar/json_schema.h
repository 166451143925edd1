// JSON Schema (and "any JSON") compiled to a grammar, so that generation yields documents that
// validate. The schema is written as GBNF (json_schema_to_gbnf, readable for debugging) and that is
// parsed. Supported keywords (docs/structured-output.md has the table):
//
//   type (a name or a list), properties, required, additionalProperties (false, true or a schema),
//   items, prefixItems, minItems, maxItems, enum, const, anyOf, oneOf (as anyOf), allOf (object
//   schemas merged), $ref (JSON pointers into the document: #/$defs/..., #/definitions/...,
//   recursion included), $defs, definitions, minLength, maxLength, pattern (regex_grammar.h's
//   subset), format (date, time, date-time, uuid), minimum, maximum, exclusiveMinimum,
//   exclusiveMaximum (integers only), nullable (OpenAPI's), and the annotations (title,
//   description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly),
//   which constrain nothing.
//
// Anything else is one specrun::Error naming the keyword and its JSON path, never ignored.
//
// Shapes of the output: properties in the schema's order, required ones always, optional ones
// possibly omitted; other properties (when allowed) after them, with keys written without escapes
// and different from every listed property; integers of at most 16 digits, numbers of at most 16
// integer and 16 fraction digits and a 2-digit exponent; no whitespace around the top-level value.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/grammar/grammar.h"

namespace specrun::grammar {

struct JsonSchemaOptions {
  // An object schema without `additionalProperties` allows no properties but those it lists (the
  // JSON Schema default is to allow any, which a model would fill with invented keys; set true for
  // that).
  bool additional_properties_default = false;
  // Whitespace between tokens (after `{`, `[`, `,`, `:` and before `}`, `]`, `,`, `:`): none, one
  // space, or one newline followed by at most this many spaces or tabs. Bounded, so that a model
  // cannot stall on whitespace forever; 0 allows no whitespace at all.
  int max_indent = 20;
  // The name of the rule a document is, so that another grammar can embed the schema's (which
  // then defines `root` itself).
  std::string root_rule = "root";
};

// The GBNF text of `schema` (top rule options.root_rule). Throws specrun::Error naming the keyword
// and its JSON path (as a JSON pointer, e.g. "#/properties/age/multipleOf") for anything
// unsupported or malformed. An ordered_json keeps the properties in the order the schema writes
// them (a nlohmann::json converts, with its keys sorted); the text overloads parse it so.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                const JsonSchemaOptions& options = {});
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema,
                                                   const JsonSchemaOptions& options = {});
// `schema_text` is the schema's JSON text; malformed JSON is an Error naming the offset.
std::shared_ptr<const Grammar> json_schema_grammar(std::string_view schema_text,
                                                   const JsonSchemaOptions& options = {});

// Any JSON value (`object_only`: any JSON object, OpenAI's response_format {"type":
// "json_object"}), with the same whitespace and number rules.
std::string any_json_gbnf(bool object_only, const JsonSchemaOptions& options = {});
std::shared_ptr<const Grammar> any_json_grammar(bool object_only,
                                                const JsonSchemaOptions& options = {});

}  // namespace specrun::grammar
