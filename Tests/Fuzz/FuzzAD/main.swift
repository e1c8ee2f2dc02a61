// Entry point: libFuzzer drives `fuzzOne` under scripts/fuzz; a plain build replays corpus
// files given as arguments (FuzzSupport's fuzzMain). `fuzzOne` goes in a closure: named
// bare, a debug build would define its C entry here again.
import FuzzSupport

fuzzMain(check, { fuzzOne($0, $1) })
