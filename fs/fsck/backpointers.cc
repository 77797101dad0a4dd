// fsck's backpointers pass (pass.h; design: docs/design/fsck.md,
// "Backpointers"; format: docs/format/backpointers.md). The extents are the
// truth: every pointer of every extent that parses implies one backpointer
// (data::BackpointerOf; none for a cached copy or one outside the buckets),
// and the tree must hold exactly those. The
// comparison is data::CheckBackpointers -- the same one the tests use --
// which walks the extents and the tree in key order with bounded memory; this
// file reports what it finds and, with -y, repairs it: a missing or wrong
// backpointer is set to what the extents say, one no extent implies is
// deleted. Positions two pointers imply (blocks claimed twice: damage the
// extents carry, which no pass repairs yet) are notes; the key names the
// first claimant by extent key.
//
// Runs after the namespace pass, whose extent repairs keep the backpointers
// in step themselves (data::QueueBackpointers in their transactions), so
// what is left here is damage to this tree. Repairs are batched, kBatch a
// transaction, each backpointer whole: a crash leaves a prefix of them and
// the next run does the rest. Without -y nothing is written.
#include "data/backpointer.h"
#include "fsck/pass.h"

namespace tfs::fsck {
namespace {

constexpr u32 kMaxLines = 20;  // findings listed one line each; the rest are counted
constexpr u32 kBatch = 128;    // repairs a transaction

class BackpointerPass {
 public:
  BackpointerPass(store::Store& e, const Options& opt, Ctx& c)
      : e_(e), repair_(opt.repair), c_(c), tx_(&e.btrees()) {}

  bool Run() {
    data::BackpointerCheckStats stats;
    Status st = data::CheckBackpointers(&e_.btrees(), e_.sb(), OnMismatch, this, &stats);
    if (st.ok()) st = Flush();
    if (!st.ok()) {
      c_.Line("backpointers: %s failed: %s", write_failed_ ? "writing a repair" : "reading the btrees", st.Message());
      c_.report->errors++;
    }
    const u64 found = missing_ + wrong_ + stray_;
    if (listed_ < found + shared_)
      c_.Line("backpointers: %llu more finding(s) not listed", (unsigned long long)(found + shared_ - listed_));
    if (found != 0)
      c_.Line("backpointers: %llu missing, %llu wrong, %llu with no extent%s", (unsigned long long)missing_,
              (unsigned long long)wrong_, (unsigned long long)stray_,
              !repair_ ? "; 'tierfs fsck -y' rewrites them from the extents"
                       : st.ok() ? ": rewritten from the extents" : "");
    c_.Line("backpointers: %llu keys, %llu implied by the pointers of %llu extents (%llu cached and %llu outside "
            "the buckets have none; %u walk(s) of the extents), %llu problem(s)",
            (unsigned long long)stats.keys, (unsigned long long)stats.expected, (unsigned long long)stats.extents,
            (unsigned long long)stats.cached, (unsigned long long)stats.no_key, stats.passes,
            (unsigned long long)found);
    return st.ok();
  }

 private:
  static Status OnMismatch(void* ctx, const data::BackpointerMismatch& m) {
    return static_cast<BackpointerPass*>(ctx)->Mismatch(m);
  }

  const char* Member(u32 dev, char* buf, usize n) const {
    if (dev < e_.sb().nr_members) return e_.sb().members[dev].label;
    platform::Format(buf, n, "#%u", dev);
    return buf;
  }

  // "member ssd.a block 300 piece 2"
  void Where(const data::Backpointer& bp, char* out, usize n) const {
    char m[24];
    platform::Format(out, n, "member %s block %llu piece %u", Member(bp.dev, m, sizeof(m)),
                     (unsigned long long)bp.block, bp.piece);
  }
  static void Whose(const data::Backpointer& bp, char* out, usize n) {
    platform::Format(out, n, "inode %llu blocks [%llu, %llu)", (unsigned long long)bp.ino,
                     (unsigned long long)(bp.end - bp.blocks), (unsigned long long)bp.end);
  }

  Status Mismatch(const data::BackpointerMismatch& m) {
    data::Backpointer at;  // the position, decoded
    at.dev = u32(m.pos.inode);
    at.block = m.pos.offset >> data::kBpPieceBits;
    at.piece = u32(m.pos.offset & data::kBpMaxPiece);
    char where[96], want[96], have[96];
    Where(at, where, sizeof(where));
    Whose(m.want, want, sizeof(want));
    if (m.have_ok)
      Whose(m.have, have, sizeof(have));
    else
      platform::Format(have, sizeof(have), "a value that does not parse");
    const bool list = listed_ < kMaxLines;
    switch (m.kind) {
      case data::BackpointerMismatch::kShared:
        shared_++;
        c_.report->notes++;
        if (list)
          c_.Line("backpointers: %s is claimed by %u pointers (blocks claimed twice; not repaired here): the key "
                  "names the first, %s",
                  where, m.claims, want);
        break;
      case data::BackpointerMismatch::kMissing:
        missing_++;
        c_.report->errors++;
        if (list) c_.Line("backpointers: missing at %s: the extent %s points there", where, want);
        break;
      case data::BackpointerMismatch::kWrong:
        wrong_++;
        c_.report->errors++;
        if (list) c_.Line("backpointers: wrong at %s: it says %s, the extent is %s", where, have, want);
        break;
      case data::BackpointerMismatch::kStray:
        stray_++;
        c_.report->errors++;
        if (list) c_.Line("backpointers: no extent points at %s, which says %s", where, have);
        break;
    }
    if (list) listed_++;
    if (!repair_ || m.kind == data::BackpointerMismatch::kShared) return Status::Ok();
    // The repair, batched (a set or delete at this position only: the walk
    // goes on after it).
    for (int round = 0;; round++) {
      Status st;
      if (m.kind == data::BackpointerMismatch::kStray) {
        st = tx_.Delete(m.pos);
      } else {
        const data::BackpointerFormat f = data::BuildBackpointer(m.want);
        st = tx_.Set(m.pos, &f, sizeof(f));
      }
      if (st.ok()) break;
      if (st.code() != Err::kTooBig || round > 0 || queued_ == 0) return st;
      TFS_TRY(Flush());  // the journal entry is full: commit what is queued, then queue it again
    }
    queued_++;
    if (queued_ >= kBatch) TFS_TRY(Flush());
    return Status::Ok();
  }

  Status Flush() {
    if (queued_ == 0) return Status::Ok();
    auto r = tx_.Commit();
    if (!r.ok()) {
      write_failed_ = true;
      return r.status();
    }
    c_.report->repaired += queued_;
    queued_ = 0;
    return Status::Ok();
  }

  store::Store& e_;
  const bool repair_;
  Ctx& c_;
  btree::Transaction tx_;
  u32 queued_ = 0;  // repairs in tx_
  bool write_failed_ = false;
  u64 missing_ = 0, wrong_ = 0, stray_ = 0, shared_ = 0;
  u64 listed_ = 0;
};

}  // namespace

bool CheckBackpointerTree(store::Store& e, const Options& opt, Ctx& c) {
  BackpointerPass* pass = platform::New<BackpointerPass>(e, opt, c);
  if (pass == nullptr) {
    c.Line("backpointers: out of memory");
    c.report->exit_code = kExitOperational;
    return false;
  }
  const bool done = pass->Run();
  platform::Delete(pass);
  return done;
}

}  // namespace tfs::fsck
