// A plain C face on SentencePiece, built as its own shared module (libxloco_spm.so) and loaded by
// tokenizer.cpp with dlopen(RTLD_LOCAL | RTLD_DEEPBIND). Why: Debian's libsentencepiece bundles
// its own copy of protobuf-lite and exports it, while LibTorch loads the system libprotobuf; linked
// into one program, the two interpose on each other and the process crashes before main. Loaded
// this way, SentencePiece binds to its own copy and LibTorch never sees it. No torch here.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace {

using Processor = sentencepiece::SentencePieceProcessor;

void set_error(char* err, size_t n, const std::string& what) {
  if (err == nullptr || n == 0) return;
  std::strncpy(err, what.c_str(), n - 1);
  err[n - 1] = '\0';
}

using NextLine = int (*)(void* ctx, const char** data, size_t* size);

class CallbackLines : public sentencepiece::SentenceIterator {
 public:
  CallbackLines(NextLine next, void* ctx) : next_(next), ctx_(ctx) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    const char* data = nullptr;
    size_t size = 0;
    done_ = next_(ctx_, &data, &size) == 0;
    if (!done_) value_.assign(data, size);
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  NextLine next_;
  void* ctx_;
  std::string value_;
  bool done_ = false;
};

}  // namespace

extern "C" {

// Returns a processor, or null with the reason in err.
void* xspm_load(const char* path, char* err, size_t err_size) {
  auto sp = std::make_unique<Processor>();
  const auto status = sp->Load(path);
  if (!status.ok()) {
    set_error(err, err_size, status.ToString());
    return nullptr;
  }
  return sp.release();
}

void xspm_free(void* sp) { delete static_cast<Processor*>(sp); }
int xspm_piece_size(void* sp) { return static_cast<Processor*>(sp)->GetPieceSize(); }
int xspm_eos_id(void* sp) { return static_cast<Processor*>(sp)->eos_id(); }
int xspm_is_control(void* sp, int id) { return static_cast<Processor*>(sp)->IsControl(id); }
int xspm_is_byte(void* sp, int id) { return static_cast<Processor*>(sp)->IsByte(id); }
int xspm_is_unknown(void* sp, int id) { return static_cast<Processor*>(sp)->IsUnknown(id); }
const char* xspm_id_to_piece(void* sp, int id) {
  return static_cast<Processor*>(sp)->IdToPiece(id).c_str();
}

// Encodes text[0, size) into a malloc'd array the caller frees with free(); returns the count,
// or -1 with the reason in err.
long xspm_encode(void* sp, const char* text, size_t size, int** ids, char* err, size_t err_size) {
  std::vector<int> out;
  const auto status = static_cast<Processor*>(sp)->Encode(std::string_view(text, size), &out);
  if (!status.ok()) {
    set_error(err, err_size, status.ToString());
    return -1;
  }
  *ids = static_cast<int*>(std::malloc(std::max<size_t>(1, out.size()) * sizeof(int)));
  std::copy(out.begin(), out.end(), *ids);
  return static_cast<long>(out.size());
}

// Trains with `args` (alternating key, value C strings, `n_args` pairs) on the lines `next`
// yields; returns the serialized model in a malloc'd buffer (free()) and its size, or -1.
long xspm_train(const char* const* args, size_t n_args, NextLine next, void* ctx, char** model,
                char* err, size_t err_size) {
  std::unordered_map<std::string, std::string> kwargs;
  for (size_t i = 0; i < n_args; ++i) kwargs[args[2 * i]] = args[2 * i + 1];
  CallbackLines lines(next, ctx);
  std::string out;
  const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, &out);
  if (!status.ok()) {
    set_error(err, err_size, status.ToString());
    return -1;
  }
  *model = static_cast<char*>(std::malloc(std::max<size_t>(1, out.size())));
  std::memcpy(*model, out.data(), out.size());
  return static_cast<long>(out.size());
}

}  // extern "C"
