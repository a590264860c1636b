// Any bytes: encode never fails, ids decode back to the input with invalid UTF-8 replaced
// (tokenizer.h), in one piece or streamed; arbitrary ids decode and stream alike.
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "tokenizer/utf8.h"

using namespace dsv4;
using namespace dsv4::tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer* tok = fuzz::v4_tokenizer();
  if (!tok) fuzz::broken("DSV4_TOKENIZER_JSON is not set (fuzz/run.sh sets it)");
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string valid = to_valid_utf8(text);
  for (bool parse_special : {true, false}) {
    std::vector<int32_t> ids = tok->encode(text, parse_special);
    if (tok->decode(ids) != valid) fuzz::broken("decode(encode(x)) == to_valid_utf8(x)");
    StreamDecoder stream(*tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    if (streamed != valid) fuzz::broken("streamed decode == decode");
  }
  // The same bytes read as ids.
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 2 < size; i += 3) ids.push_back(int32_t((data[i] << 16 | data[i + 1] << 8 | data[i + 2]) % tok->vocab_size()));
  for (bool skip : {false, true}) {
    std::string whole = tok->decode(ids, skip);
    if (!is_valid_utf8(whole)) fuzz::broken("decode gives valid UTF-8");
    StreamDecoder stream(*tok, skip);
    std::string streamed;
    for (int32_t id : ids) {
      std::string piece = stream.push(id);
      if (!is_valid_utf8(piece)) fuzz::broken("stream pieces are valid UTF-8");
      streamed += piece;
    }
    if (streamed + stream.finish() != whole) fuzz::broken("streamed decode == decode (ids)");
  }
  return 0;
}
