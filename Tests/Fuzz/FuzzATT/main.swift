// Entry point. scripts/fuzz builds with -DBATON_LIBFUZZER and -sanitize=fuzzer: libFuzzer
// drives `fuzzOne`. A plain build replays corpus files given as arguments.
import FuzzSupport

#if BATON_LIBFUZZER
runLibFuzzer(fuzzOne)
#else
replayCorpusAndExit(check)
#endif
