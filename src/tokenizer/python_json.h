// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it — what the V4
// reference encoder puts into prompts (tool schemas, non-string tool arguments, response_format)
// and what its parser produces for tool-call arguments (tokenizer-and-chat.md §3.3, §4.1).
//
// Separators ", " and ": ", object keys in their original order (use nlohmann::ordered_json),
// non-ASCII kept raw, control characters as \n \t … or \u00XX, floats like Python's repr
// (1.0, 2.5, 1e-05, 1e+16). Integers beyond 64 bits cannot be represented by nlohmann::json and
// arrive here as floats: that is the one known difference from Python.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace dsv4::tokenizer {

std::string python_json_dumps(const nlohmann::ordered_json& value);

// A JSON string literal (with quotes) for s, escaped like Python's json.dumps.
std::string python_json_string(std::string_view s);
void append_python_json_string_body(std::string& out, std::string_view s);  // without quotes

// Python's repr() of a float, as json.dumps writes it.
std::string python_float_repr(double value);

}  // namespace dsv4::tokenizer
