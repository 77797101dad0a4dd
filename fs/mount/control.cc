// The control commands (control.h).
//
// The line is hostile input (it comes from any process that can open the
// mount's root): it is read only within `len` and up to its first NUL,
// every byte at or below a space separates words (so no reply quotes a
// newline), and a word quoted back is cut to 32 bytes with anything not
// printable ASCII shown as '?'.
#include "mount/control.h"

#include "bg/engine.h"
#include "platform/platform.h"

namespace tfs::mount {
namespace {

constexpr usize kQuoteMax = 32;
constexpr const char* kEngineList = "reconcile, promote, copygc, all";

struct Word {
  const char* p = nullptr;
  usize n = 0;
};

bool IsSpace(char c) { return u8(c) <= 0x20; }

// The next word of line[*at, len), or false at the end.
bool NextWord(const char* line, usize len, usize* at, Word* w) {
  usize i = *at;
  while (i < len && IsSpace(line[i])) i++;
  if (i == len) {
    *at = i;
    return false;
  }
  const usize start = i;
  while (i < len && !IsSpace(line[i])) i++;
  *w = Word{line + start, i - start};
  *at = i;
  return true;
}

bool Is(const Word& w, const char* word) {
  usize i = 0;
  for (; word[i] != '\0'; i++)
    if (i >= w.n || w.p[i] != word[i]) return false;
  return i == w.n;
}

// "error: WHAT 'WORD' (LIST)": the word cut and made printable.
Status RefuseWord(char* reply, usize cap, const char* what, const Word& w, const char* list) {
  char q[kQuoteMax + 1];
  const usize n = w.n < kQuoteMax ? w.n : kQuoteMax;
  for (usize i = 0; i < n; i++) q[i] = (u8(w.p[i]) > 0x20 && u8(w.p[i]) < 0x7f) ? w.p[i] : '?';
  q[n] = '\0';
  platform::Format(reply, cap, "error: %s '%s' (%s)", what, q, list);
  return Err::kInvalidArgument;
}

Status Refuse(char* reply, usize cap, const char* what) {
  platform::Format(reply, cap, "error: %s", what);
  return Err::kInvalidArgument;
}

}  // namespace

Status RunControl(Instance& inst, const char* line, usize len, char* reply, usize cap) {
  if (cap == 0) return Err::kInvalidArgument;
  reply[0] = '\0';
  if (!inst.open()) return Refuse(reply, cap, "the filesystem is not mounted");
  for (usize i = 0; i < len; i++) {
    if (line[i] == '\0') {
      len = i;
      break;
    }
  }
  usize at = 0;
  Word cmd;
  if (!NextWord(line, len, &at, &cmd))
    return Refuse(reply, cap, "usage: pause|resume ENGINE... (ENGINE: reconcile, promote, copygc, all)");
  const bool pause = Is(cmd, "pause");
  if (!pause && !Is(cmd, "resume")) return RefuseWord(reply, cap, "unknown command", cmd, "pause, resume");
  // Every word is checked before any engine is touched.
  u32 mask = 0;
  Word w;
  u32 words = 0;
  while (NextWord(line, len, &at, &w)) {
    const u32 m = bg::EngineMask(w.p, w.n);
    if (m == 0) return RefuseWord(reply, cap, "unknown engine", w, kEngineList);
    mask |= m;
    words++;
  }
  if (words == 0)
    return Refuse(reply, cap, pause ? "usage: pause ENGINE... (ENGINE: reconcile, promote, copygc, all)"
                                    : "usage: resume ENGINE... (ENGINE: reconcile, promote, copygc, all)");
  if (pause)
    inst.engines().Pause(mask);
  else
    inst.engines().Resume(mask);
  int n = platform::Format(reply, cap, "ok %s:", pause ? "paused" : "resumed");
  usize out = n > 0 ? usize(n) : cap;
  for (u32 i = 0; i < bg::kEngineCount && out < cap; i++) {
    if (((mask >> i) & 1) == 0) continue;
    n = platform::Format(reply + out, cap - out, " %s", bg::EngineName(bg::EngineId(i)));
    out = n > 0 ? out + usize(n) : cap;
  }
  return Status::Ok();
}

}  // namespace tfs::mount
