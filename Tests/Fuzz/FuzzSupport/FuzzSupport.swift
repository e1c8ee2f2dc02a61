// Shared by the fuzz targets. Built with -sanitize=fuzzer (scripts/fuzz), libFuzzer owns
// main and calls LLVMFuzzerTestOneInput. Built plain (`swift build`), a target is a corpus
// replayer: `FuzzX FILE…` runs each file through the same check, so a crash input that
// scripts/fuzz found becomes a regression test by adding the file to Tests/Fuzz/corpus/.
import Glibc

/// Fails the run: libFuzzer records the input as a crash, the replayer exits non-zero.
public func invariant(_ condition: Bool, _ message: @autoclosure () -> String,
                      file: StaticString = #fileID, line: UInt = #line) {
    guard !condition else { return }
    printError("invariant broken at \(file):\(line): \(message())")
    abort()
}

#if BATON_LIBFUZZER
// libFuzzer's entry for programs that own main (compiler-rt FuzzerInterface.h). SwiftPM
// renames an executable's main, so we keep ours and call the driver from it.
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<Int32>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32) -> Int32

public func runLibFuzzer(_ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32) -> Never {
    var argc = CommandLine.argc
    var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
    exit(LLVMFuzzerRunDriver(&argc, &argv, callback))
}
#endif

/// Lower-case hex, for invariant messages.
public func hex(_ b: some Sequence<UInt8>) -> String {
    let d = Array("0123456789abcdef")
    return String(b.flatMap { [d[Int($0 >> 4)], d[Int($0 & 0xF)]] })
}

/// Where `slice` starts inside `whole`, or nil when it does not lie entirely inside it:
/// how a target proves that a decoder's borrowed slices point into its input.
public func offset(of slice: UnsafeRawBufferPointer, in whole: UnsafeRawBufferPointer) -> Int? {
    guard let base = whole.baseAddress else { return slice.isEmpty ? 0 : nil }
    guard let start = slice.baseAddress else { return nil }
    let lower = start - base
    guard lower >= 0, lower + slice.count <= whole.count else { return nil }
    return lower
}

/// Every target's main.swift: built by scripts/fuzz (-DBATON_LIBFUZZER), libFuzzer's driver
/// calls the target's `fuzzOne`; built plain, the files and directories named on the command
/// line are replayed through its `check`.
public func fuzzMain(_ check: (UnsafeRawBufferPointer) -> Void,
                     _ fuzzOne: @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32) -> Never {
#if BATON_LIBFUZZER
    runLibFuzzer(fuzzOne)
#else
    replayCorpusAndExit(check)
#endif
}

/// The plain build's main: replays the files and directories named on the command line.
public func replayCorpusAndExit(_ check: (UnsafeRawBufferPointer) -> Void) -> Never {
    exit(replayCorpus(Array(CommandLine.arguments.dropFirst()), check))
}

/// Replays corpus files (or directories of them) through `check`; returns the exit status.
public func replayCorpus(_ arguments: [String], _ check: (UnsafeRawBufferPointer) -> Void) -> Int32 {
    var files = 0
    for path in arguments {
        for file in expand(path) {
            guard let bytes = readFile(file) else {
                printError("cannot read \(file)")
                return 2
            }
            bytes.withUnsafeBytes { check($0) }
            files += 1
        }
    }
    print("replayed \(files) input(s), all invariants held")
    return 0
}

private func expand(_ path: String) -> [String] {
    guard let dir = opendir(path) else { return [path] }
    defer { closedir(dir) }
    var out: [String] = []
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        if name == "." || name == ".." { continue }
        out.append(path + "/" + name)
    }
    return out.sorted()
}

private func readFile(_ path: String) -> [UInt8]? {
    guard let f = fopen(path, "rb") else { return nil }
    defer { fclose(f) }
    var out: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = chunk.withUnsafeMutableBytes { fread($0.baseAddress, 1, 65536, f) }
        if n == 0 { break }
        out += chunk[..<n]
    }
    return out
}

private func printError(_ message: String) {
    var line = message + "\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}
