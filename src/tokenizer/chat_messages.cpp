// OpenAI-shaped JSON → chat_format.h's Message, with errors that name the offending field; and
// the checkpoint-variant detection (tokenizer-and-chat.md §3.1).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/chat_format.h"

namespace dsv4::tokenizer {

namespace {

std::string string_field(const ordered_json& object, const char* name, const std::string& where) {
  if (!object.contains(name) || object[name].is_null()) return {};
  if (!object[name].is_string())
    fail(ErrorCode::invalid_input, "{}.{}: got {}, expected a string", where, name, object[name].type_name());
  return object[name].get<std::string>();
}

ToolCall tool_call_from_json(const ordered_json& j, const std::string& where) {
  if (!j.is_object()) fail(ErrorCode::invalid_input, "{}: expected an object", where);
  ToolCall call;
  call.id = string_field(j, "id", where);
  const ordered_json& function = j.contains("function") ? j["function"] : j;  // also accept {name, arguments}
  if (!function.is_object()) fail(ErrorCode::invalid_input, "{}.function: expected an object", where);
  if (call.id.empty()) call.id = string_field(function, "id", where + ".function");
  call.name = string_field(function, "name", where + ".function");
  if (call.name.empty()) fail(ErrorCode::invalid_input, "{}.function.name: missing", where);
  call.arguments = function.contains("arguments") ? function["arguments"] : ordered_json(nullptr);
  return call;
}

}  // namespace

std::vector<Message> messages_from_json(const ordered_json& messages) {
  if (!messages.is_array()) fail(ErrorCode::invalid_input, "messages: expected an array");
  std::vector<Message> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& j = messages[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!j.is_object()) fail(ErrorCode::invalid_input, "{}: expected an object", where);
    Message m;
    m.role = string_field(j, "role", where);
    static const char* roles[] = {"system", "user", "assistant", "tool", "developer", "latest_reminder"};
    if (std::find(std::begin(roles), std::end(roles), m.role) == std::end(roles))
      fail(ErrorCode::invalid_input, "{}.role: \"{}\" is not one of system, user, assistant, tool, developer, "
           "latest_reminder", where, m.role);
    if (j.contains("content")) m.content = j["content"];
    if (!m.content.is_null() && !m.content.is_string() && !m.content.is_array() && m.role != "tool")
      fail(ErrorCode::invalid_input, "{}.content: got {}, expected a string or an array of parts", where,
           m.content.type_name());
    m.reasoning_content = string_field(j, "reasoning_content", where);
    if (m.reasoning_content.empty()) m.reasoning_content = string_field(j, "reasoning", where);
    if (j.contains("tool_calls") && !j["tool_calls"].is_null()) {
      if (!j["tool_calls"].is_array()) fail(ErrorCode::invalid_input, "{}.tool_calls: expected an array", where);
      for (size_t k = 0; k < j["tool_calls"].size(); ++k)
        m.tool_calls.push_back(tool_call_from_json(j["tool_calls"][k], where + ".tool_calls[" + std::to_string(k) + "]"));
    }
    m.tool_call_id = string_field(j, "tool_call_id", where);
    if (j.contains("tools")) m.tools = j["tools"];
    if (!m.tools.is_null() && !m.tools.is_array())
      fail(ErrorCode::invalid_input, "{}.tools: expected an array", where);
    if (j.contains("response_format")) m.response_format = j["response_format"];
    if (j.contains("task") && !j["task"].is_null()) m.task = string_field(j, "task", where);
    if (j.contains("wo_eos")) {
      if (!j["wo_eos"].is_boolean()) fail(ErrorCode::invalid_input, "{}.wo_eos: expected a boolean", where);
      m.wo_eos = j["wo_eos"].get<bool>();
    }
    out.push_back(std::move(m));
  }
  return out;
}

ChatVariant detect_chat_variant(const std::string& model_dir) {
  std::ifstream in(std::filesystem::path(model_dir) / "encoding" / "encoding_dsv4.py");
  if (in) {
    std::stringstream source;
    source << in.rdbuf();
    // The 0731 encoder replaced REASONING_EFFORT_MAX by a low/high/max table (§3.1).
    if (source.str().find("REASONING_EFFORT_PROMPTS") != std::string::npos) return ChatVariant::v4_0731;
    return ChatVariant::v4_preview;
  }
  std::ifstream config(std::filesystem::path(model_dir) / "config.json");
  if (config) {
    std::stringstream text;
    text << config.rdbuf();
    if (text.str().find("0731") != std::string::npos) return ChatVariant::v4_0731;
  }
  return ChatVariant::v4_preview;
}

}  // namespace dsv4::tokenizer
