// What the firmware's modules need from libc beyond what imports as it is (docs/firmware.md).
// Embedded Swift has no Glibc overlay, so every module the daemon links reaches libc through
// our own map (CLibc); the two things that map cannot carry, errno and fcntl, live here, and so
// does the monotonic clock the loop's deadlines are read on, since `ContinuousClock` belongs to
// the concurrency runtime Embedded Swift leaves out.
public import CLibc

/// The calling thread's `errno`, as Glibc's overlay spells it.
public var errno: Int32 {
    get { baton_errno() }
    set { baton_set_errno(newValue) }
}

/// `fcntl(fd, command)`: F_GETFL, F_GETFD.
@inline(__always)
public func fcntl(_ fd: Int32, _ command: Int32) -> Int32 { baton_fcntl_get(fd, command) }

/// `fcntl(fd, command, value)`: F_SETFL, F_SETFD.
@inline(__always)
public func fcntl(_ fd: Int32, _ command: Int32, _ value: Int32) -> Int32 { baton_fcntl_set(fd, command, value) }

/// A point on the monotonic clock (CLOCK_MONOTONIC, like `ContinuousClock` on Linux): what
/// every deadline in the loop is kept in. Nanoseconds since an unspecified start; never read
/// as a time of day.
public struct Instant: Comparable, Hashable, Sendable {
    public var nanoseconds: Int64

    @inline(__always)
    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }

    /// Now, on the monotonic clock.
    public static var now: Instant { Instant(nanoseconds: baton_monotonic_nanoseconds()) }

    public static func < (a: Instant, b: Instant) -> Bool { a.nanoseconds < b.nanoseconds }

    public static func + (a: Instant, d: Duration) -> Instant { Instant(nanoseconds: a.nanoseconds &+ d.nanoseconds) }
    public static func - (a: Instant, d: Duration) -> Instant { Instant(nanoseconds: a.nanoseconds &- d.nanoseconds) }
    public static func += (a: inout Instant, d: Duration) { a = a + d }
    public static func - (a: Instant, b: Instant) -> Duration { .nanoseconds(a.nanoseconds &- b.nanoseconds) }

    public func advanced(by d: Duration) -> Instant { self + d }
    /// This instant plus a span already in nanoseconds (`Duration.nanoseconds`, converted once
    /// by a caller that adds it often).
    @inline(__always)
    public func after(_ nanoseconds: Int64) -> Instant { Instant(nanoseconds: self.nanoseconds &+ nanoseconds) }
    /// The earlier of two deadlines, either of which may be none.
    @inline(__always)
    public static func earliest(_ a: Instant?, _ b: Instant?) -> Instant? {
        guard let a else { return b }
        guard let b else { return a }
        return b < a ? b : a
    }
    public func duration(to other: Instant) -> Duration { other - self }
}

extension Duration {
    /// The duration in whole nanoseconds, saturating: what the monotonic clock counts in.
    @inline(__always)
    public var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (ns, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return ns &+ attoseconds / 1_000_000_000
    }

    /// The duration in whole microseconds, toward zero: the unit of the simulator's clock and
    /// of the timestamps written into payloads. Durations of a process's life: no overflow.
    @inline(__always)
    public var microseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000 + attoseconds / 1_000_000_000_000
    }

    /// The duration as full Swift's `description` writes it ("60.0 seconds", "0.25 seconds"),
    /// in both builds: Embedded Swift has no description for a Duration and would write "(cannot
    /// print value in embedded Swift)" into a log line or an answer's detail. Whole nanoseconds,
    /// the trailing zeros dropped but one: from a tenth of a millisecond to years (every duration
    /// the config holds), the digits full Swift writes.
    public var secondsDescription: String {
        var ns = nanoseconds
        var text = ""
        if ns < 0 {
            text = "-"
            ns = ns == .min ? .max : -ns
        }
        text += String(ns / 1_000_000_000)
        var fraction = ns % 1_000_000_000
        var digits = 9
        while digits > 1 && fraction % 10 == 0 { fraction /= 10; digits -= 1 }
        let padded = String(fraction)
        text += "." + String(repeating: "0", count: digits - padded.count) + padded
        return text + " seconds"
    }

    /// The duration as poll(2)'s timeout: whole milliseconds rounded up (waking a hair early
    /// would spin a turn for nothing), 0 for none or less, at most `cap`. The one conversion
    /// every loop uses.
    public func pollMilliseconds(atMost cap: Int32 = .max) -> Int32 {
        guard self > .zero else { return 0 }
        let (seconds, attoseconds) = components
        guard seconds < Int64(cap) / 1000 else { return cap }
        let ms = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(Swift.min(ms, Int64(cap)))
    }
}

/// `open(path, flags)` without a mode: opening, never creating. open(2) is variadic.
@inline(__always)
public func open(_ path: UnsafePointer<CChar>, _ flags: Int32) -> Int32 { baton_open(path, flags) }

/// `ioctl(fd, request, value)` for the requests that take an int (HCIDEVUP). ioctl(2) is variadic.
@inline(__always)
public func ioctl(_ fd: Int32, _ request: UInt, _ value: Int32) -> Int32 { baton_ioctl_int(fd, request, value) }

/// The name of the user this process runs as (`baton` under the unit), or `uid N`: who a
/// "Permission denied" is about.
public func currentUserName() -> String {
    let uid = geteuid()
    if let entry = getpwuid(uid), let name = entry.pointee.pw_name { return String(cString: name) }
    return "uid \(uid)"
}

/// The whole of a file, or the OS's reason it cannot be opened or read (`Errno.message`, e.g.
/// "Permission denied": what a user acts on). A file that blocks (a FIFO with no writer) blocks:
/// this is for start-up, never the loop.
public func readFile(_ path: String) throws(Errno) -> [UInt8] {
    guard let fd = try Syscall.call("open", { Int(BatonLibc.open(path, O_RDONLY | O_CLOEXEC)) }) else {
        throw Errno(EAGAIN, call: "open")
    }
    defer { Syscall.close(Int32(fd)) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65_536)
    while true {
        // Array.withUnsafeMutableBytes rethrows untyped: the read's result travels out as a value.
        let read: Result<Int, Errno> = chunk.withUnsafeMutableBytes { buffer in
            do throws(Errno) { return .success(try Syscall.read(Int32(fd), into: buffer) ?? 0) } catch { return .failure(error) }
        }
        let n = try read.get()
        guard n > 0 else { return bytes }
        bytes.append(contentsOf: chunk[0..<n])
    }
}

/// The process's environment, `NAME=value` pairs as `environ` holds them.
public func processEnvironment() -> [String: String] {
    var out: [String: String] = [:]
    guard var entry = baton_environ() else { return out }
    while let c = entry.pointee {
        let text = String(cString: c)
        if let eq = text.utf8.firstIndex(of: UInt8(ascii: "=")) {
            out[String(text[..<eq])] = String(text[text.index(after: eq)...])
        }
        entry += 1
    }
    return out
}

/// Writes all of `text` to a descriptor, retrying after signals; what cannot be written is dropped.
public func writeAll(_ fd: Int32, _ text: String) {
    var utf8 = Array(text.utf8)
    utf8.withUnsafeMutableBytes { bytes in
        var sent = 0
        while sent < bytes.count {
            let n = write(fd, bytes.baseAddress! + sent, bytes.count - sent)
            if n > 0 { sent += n } else if n < 0, errno == EINTR { continue } else { return }
        }
    }
}

public func writeStandardError(_ text: String) { writeAll(2, text) }
public func writeStandardOutput(_ text: String) { writeAll(1, text) }
