#include "tokenizer/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace dsv4::tokenizer {

void append_python_json_string_body(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += hex[(c >> 4) & 0xF];
          out += hex[c & 0xF];
        } else {
          out += c;
        }
    }
  }
}

std::string python_json_string(std::string_view s) {
  std::string out = "\"";
  append_python_json_string_body(out, s);
  out += '"';
  return out;
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits (what Python's repr uses too), then Python's layout: positional
  // when the decimal exponent is in [-4, 16), else scientific with a two-digit minimum exponent.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  std::string_view sci(buf, end - buf);
  std::string out;
  if (sci[0] == '-') out += '-', sci.remove_prefix(1);
  size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos))
    if (c != '.') digits += c;
  int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  int point = exponent + 1;  // digits before the decimal point
  int n = int(digits.size());
  if (exponent >= -4 && exponent < 16) {
    if (point <= 0)
      out += "0." + std::string(-point, '0') + digits;
    else if (point >= n)
      out += digits + std::string(point - n, '0') + ".0";
    else
      out += digits.substr(0, point) + "." + digits.substr(point);
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    out += exponent < 0 ? "e-" : "e+";
    int magnitude = std::abs(exponent);
    if (magnitude < 10) out += '0';
    out += std::to_string(magnitude);
  }
  return out;
}

namespace {

void dump(const nlohmann::ordered_json& v, std::string& out) {
  using value_t = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case value_t::null: out += "null"; break;
    case value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case value_t::number_float: out += python_float_repr(v.get<double>()); break;
    case value_t::string: out += python_json_string(v.get_ref<const std::string&>()); break;
    case value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        dump(item, out);
      }
      out += ']';
      break;
    }
    case value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += python_json_string(key);
        out += ": ";
        dump(item, out);
      }
      out += '}';
      break;
    }
    case value_t::binary:
    case value_t::discarded: fail(ErrorCode::invalid_input, "json: a binary or discarded value has no JSON text");
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace dsv4::tokenizer
