#include "data/token_samples.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "core/error.h"
#include "data/json_integer.h"

namespace dspine::data {
namespace {

// Bytes read at a time while indexing; a longer line grows the buffer.
constexpr size_t kBlockBytes = size_t{8} << 20;

// Collects a sample line's input_ids and loss_mask from nlohmann's SAX events, without building
// a DOM: only the two lists of the top-level object are kept, everything else is skipped. What it
// found is judged afterwards (parse_sample), so a line that is not valid JSON is reported as such
// whatever its structure.
class SampleHandler {
 public:
  using json = nlohmann::json;
  enum class List { kNone, kIds, kMask };
  enum class Found { kMissing, kIntegers, kOther };  // what a key's value is

  explicit SampleHandler(TokenSample& sample) : sample_(sample) {
    sample_.input_ids.clear();
    sample_.loss_mask.clear();
  }

  bool null() { return other_value(); }
  bool boolean(bool) { return other_value(); }
  bool number_integer(json::number_integer_t value) { return integer(value); }
  bool number_unsigned(json::number_unsigned_t value) {
    return fits_int64(value) ? integer(static_cast<int64_t>(value)) : other_value();
  }
  bool number_float(json::number_float_t, const json::string_t&) { return other_value(); }
  bool string(json::string_t&) { return other_value(); }
  bool binary(json::binary_t&) { return other_value(); }
  bool start_object(std::size_t) {
    if (depth_ == 0) object_ = true;
    other_value();
    ++depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (depth_ == 1 && value_ != List::kNone) {  // the list of input_ids or loss_mask begins
      list_ = value_;
      value_ = List::kNone;
      slot(list_) = Found::kIntegers;
      values(list_).clear();  // a repeated key: the last one counts, as in a DOM
    } else {
      other_value();
    }
    ++depth_;
    return true;
  }
  bool end_object() { return end_container(); }
  bool end_array() { return end_container(); }
  bool key(json::string_t& name) {
    if (depth_ == 1 && object_) {
      value_ = name == "input_ids" ? List::kIds : name == "loss_mask" ? List::kMask : List::kNone;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    error_ = e.what();
    return false;
  }

  bool is_object() const { return object_; }
  const std::string& error() const { return error_; }
  Found found(List list) const { return list == List::kIds ? ids_ : mask_; }

 private:
  Found& slot(List list) { return list == List::kIds ? ids_ : mask_; }
  std::vector<int64_t>& values(List list) {
    return list == List::kIds ? sample_.input_ids : sample_.loss_mask;
  }
  // Any value (or the start of an object or array) that is not an integer element of a list:
  // the list, or the key's value, is not a list of integers.
  bool other_value() {
    if (depth_ == 1 && value_ != List::kNone) slot(value_) = Found::kOther;
    if (depth_ == 2 && list_ != List::kNone) slot(list_) = Found::kOther;
    value_ = List::kNone;
    return true;
  }
  bool integer(int64_t value) {
    if (depth_ == 2 && list_ != List::kNone) {
      values(list_).push_back(value);
      return true;
    }
    return other_value();
  }
  bool end_container() {
    if (--depth_ == 1) list_ = List::kNone;
    return true;
  }

  TokenSample& sample_;
  int depth_ = 0;               // open objects and arrays
  bool object_ = false;         // the line is a JSON object
  List value_ = List::kNone;    // the top-level key whose value comes next
  List list_ = List::kNone;     // the list being read (depth 2)
  Found ids_ = Found::kMissing, mask_ = Found::kMissing;
  std::string error_;
};

// Parses the sample line [begin, end) into `sample` and checks it (the rules of docs/data.md);
// errors name path:line. The constructor's indexing pass and read() share it.
void parse_sample(const char* begin, const char* end, const std::string& path, int64_t line,
                  int64_t vocab_size, TokenSample& sample) {
  const auto where = [&] { return fmt::format("{}:{}", path, line); };
  SampleHandler handler(sample);
  if (!nlohmann::json::sax_parse(begin, end, &handler)) {
    fail("{}: invalid JSON: {}", where(), handler.error());
  }
  if (!handler.is_object()) {
    fail("{}: expected a JSON object with input_ids and loss_mask", where());
  }
  for (const auto& [list, key] : {std::pair{SampleHandler::List::kIds, "input_ids"},
                                  std::pair{SampleHandler::List::kMask, "loss_mask"}}) {
    const SampleHandler::Found found = handler.found(list);
    if (found == SampleHandler::Found::kMissing) fail("{}: missing key '{}'", where(), key);
    if (found == SampleHandler::Found::kOther) {
      fail("{}: '{}' must be a list of integers", where(), key);
    }
  }
  if (sample.input_ids.empty()) fail("{}: input_ids is empty", where());
  if (sample.input_ids.size() != sample.loss_mask.size()) {
    fail("{}: input_ids has {} tokens but loss_mask {}", where(), sample.input_ids.size(),
         sample.loss_mask.size());
  }
  for (size_t i = 0; i < sample.input_ids.size(); ++i) {
    if (sample.input_ids[i] < 0 || sample.input_ids[i] >= vocab_size) {
      fail("{}: input_ids[{}] = {} is outside the vocabulary [0, {})", where(), i,
           sample.input_ids[i], vocab_size);
    }
    if (sample.loss_mask[i] != 0 && sample.loss_mask[i] != 1) {
      fail("{}: loss_mask[{}] = {} must be 0 or 1", where(), i, sample.loss_mask[i]);
    }
  }
}

using Span = std::pair<const char*, const char*>;  // a line's bytes, without its newline

// Checks the sample lines `spans`, whose line numbers are `numbers`, on at::get_num_threads()
// threads, each a contiguous share (lines are independent, and the JSON lexer is nearly all of
// the time). Plain threads: at::parallel_for runs serially here, as the project is not compiled
// with OpenMP. The error reported is the first bad line's in file order, as a serial pass would
// report it: each thread stops at its first bad line, and every line before the earliest of
// those has passed.
void check_lines(const std::vector<Span>& spans, const int64_t* numbers, const std::string& path,
                 int64_t vocab_size) {
  const auto count = static_cast<int64_t>(spans.size());
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), count));
  const int64_t share = (count + workers - 1) / workers;
  std::mutex mutex;
  int64_t first_bad = count;
  std::exception_ptr error;
  const auto check_share = [&](int64_t worker) {
    TokenSample sample;  // reused, so its lists keep their capacity from line to line
    for (int64_t i = worker * share; i < std::min(count, (worker + 1) * share); ++i) {
      try {
        parse_sample(spans[i].first, spans[i].second, path, numbers[i], vocab_size, sample);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (i < first_bad) {
          first_bad = i;
          error = std::current_exception();
        }
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int64_t worker = 1; worker < workers; ++worker) threads.emplace_back(check_share, worker);
  check_share(0);
  for (std::thread& thread : threads) thread.join();
  if (error) std::rethrow_exception(error);
}

bool is_blank(const char* begin, const char* end) {
  return std::string_view(begin, static_cast<size_t>(end - begin)).find_first_not_of(" \t\r") ==
         std::string_view::npos;
}

}  // namespace

TokenSamples::TokenSamples(std::string path, int64_t vocab_size, const std::string& key)
    : path_(std::move(path)), vocab_size_(vocab_size), file_(path_, std::ios::binary) {
  if (!file_.is_open()) {
    const std::string reason = std::strerror(errno);  // left by the failed open
    fail("{}: cannot open the token samples file{}: {}", path_,
         key.empty() ? "" : " (" + key + ")", reason);
  }
  // block[0, filled) holds the unfinished line, from file offset `block_offset`, then new bytes.
  std::vector<char> block(kBlockBytes);
  size_t filled = 0;
  int64_t block_offset = 0;
  int64_t number = 0;       // 1-based number of the last line seen
  std::vector<Span> spans;  // the block's sample lines, checked together
  for (bool at_end = false; !at_end;) {
    if (filled == block.size()) block.resize(2 * block.size());  // a line longer than the block
    file_.read(block.data() + filled, static_cast<std::streamsize>(block.size() - filled));
    filled += static_cast<size_t>(file_.gcount());
    at_end = !file_;
    const char* const data = block.data();
    const size_t first = offsets_.size();
    spans.clear();
    const auto index_line = [&](size_t start, size_t stop) {
      ++number;
      if (is_blank(data + start, data + stop)) return;
      offsets_.push_back(block_offset + static_cast<int64_t>(start));
      lines_.push_back(number);
      spans.emplace_back(data + start, data + stop);
    };
    size_t start = 0;
    while (const void* newline = std::memchr(data + start, '\n', filled - start)) {
      const size_t stop = static_cast<size_t>(static_cast<const char*>(newline) - data);
      index_line(start, stop);
      start = stop + 1;
    }
    if (at_end && start < filled) {  // a last line without a newline
      index_line(start, filled);
      start = filled;
    }
    check_lines(spans, lines_.data() + first, path_, vocab_size_);
    std::memmove(block.data(), data + start, filled - start);
    filled -= start;
    block_offset += static_cast<int64_t>(start);
  }
  if (file_.bad()) fail("{}: read error while indexing the token samples", path_);
  if (offsets_.empty()) fail("{}: holds no samples (expected one JSON object per line)", path_);
}

TokenSample TokenSamples::read(int64_t index) {
  if (index < 0 || index >= size()) {
    fail("{}: sample {} out of range [0, {})", path_, index, size());
  }
  file_.clear();
  file_.seekg(offsets_[index]);
  std::string line;
  std::getline(file_, line);
  if (file_.bad()) fail("{}:{}: read error", path_, lines_[index]);
  TokenSample sample;
  parse_sample(line.data(), line.data() + line.size(), path_, lines_[index], vocab_size_, sample);
  return sample;
}

std::pair<at::Tensor, at::Tensor> TokenSamples::rows(int64_t first, int64_t rows, int64_t seq_len) {
  if (first < 0 || rows < 1 || seq_len < 1) {
    fail("{}: cannot read {} rows of {} tokens from sample {}", path_, rows, seq_len, first);
  }
  at::Tensor ids = torch::zeros({rows, seq_len}, torch::kLong);
  at::Tensor mask = torch::zeros({rows, seq_len}, torch::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    const TokenSample sample = read((first + r) % size());
    const int64_t n = std::min<int64_t>(seq_len, static_cast<int64_t>(sample.input_ids.size()));
    for (int64_t t = 0; t < n; ++t) {
      ids_a[r][t] = sample.input_ids[t];
      mask_a[r][t] = sample.loss_mask[t];
    }
  }
  return {ids, mask};
}

}  // namespace dspine::data
