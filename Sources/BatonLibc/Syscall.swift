// The one syscall wrapper (architecture.md §5.7), after SwiftNIO's Sources/NIOPosix/System.swift:
//   * EINTR is retried (a signal landed mid-call; the call itself did nothing),
//   * EAGAIN is a value (`nil`): a non-blocking descriptor has nothing now, poll() again,
//   * EBADF and EFAULT are a `precondition`: a descriptor or buffer WE own is wrong, which is
//     our bug, never the peer's and never the OS's,
//   * everything else throws `Errno`, naming the call.
// On Linux EWOULDBLOCK == EAGAIN, so one case covers both.

public import CLibc

/// An operating-system error: which call failed and its `errno` (architecture.md §5.3: errors say
/// whose fault it is; an `Errno` is the OS's).
public struct Errno: Error, Sendable, Equatable, CustomStringConvertible {
    /// The `errno` value, e.g. `EAFNOSUPPORT`.
    public let code: Int32
    /// The call that failed, e.g. "socket(AF_BLUETOOTH)".
    public let call: StaticString

    public init(_ code: Int32, call: StaticString) {
        self.code = code
        self.call = call
    }

    public static func == (a: Errno, b: Errno) -> Bool {
        // StaticString has no Equatable; compare its UTF-8 bytes without allocating.
        a.code == b.code && a.call.withUTF8Buffer { x in b.call.withUTF8Buffer { y in x.elementsEqual(y) } }
    }

    /// The C library's text for `code`, e.g. "Address family not supported by protocol".
    public var message: String { String(cString: strerror(code)) }

    public var description: String { "\(call): \(message) (errno \(code))" }
}

/// Namespace for the wrapper and the few calls the radio sources make through it.
public enum Syscall {
    /// Runs `body` (a C call returning -1 and setting `errno` on failure) under the rules above.
    /// Returns the call's non-negative result, or `nil` for EAGAIN.
    @inline(__always)
    public static func call(_ name: StaticString, _ body: () -> Int) throws(Errno) -> Int? {
        while true {
            let r = body()
            if r >= 0 { return r }
            let e = errno
            switch e {
            case EINTR:
                continue
            case EAGAIN:
                return nil
            case EBADF:
                preconditionFailure("\(name): EBADF: a descriptor Baton owns is not open (our bug)")
            case EFAULT:
                preconditionFailure("\(name): EFAULT: a buffer Baton passed is not mapped (our bug)")
            default:
                throw Errno(e, call: name)
            }
        }
    }

    /// `read(2)`: the byte count (0 is end of stream), or `nil` when nothing is ready.
    public static func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int? {
        try call("read") { CLibc.read(fd, buffer.baseAddress, buffer.count) }
    }

    /// `write(2)`: the bytes taken (possibly fewer than offered), or `nil` when the descriptor
    /// cannot take any now.
    public static func write(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws(Errno) -> Int? {
        try call("write") { CLibc.write(fd, bytes.baseAddress, bytes.count) }
    }

    /// Sets O_NONBLOCK (and keeps the other status flags): every descriptor a radio source
    /// reads is polled by the caller's loop and must never block it.
    public static func setNonBlocking(_ fd: Int32) throws(Errno) {
        let flags = try call("fcntl(F_GETFL)") { Int(fcntl(fd, F_GETFL)) } ?? 0
        _ = try call("fcntl(F_SETFL)") { Int(fcntl(fd, F_SETFL, Int32(flags) | O_NONBLOCK)) }
    }

    /// `close(2)`. Not retried on EINTR: on Linux the descriptor is released even then, and a
    /// retry could close a descriptor another open() just received. Errors are ignored for the
    /// same reason (there is nothing left to undo); EBADF is still our bug.
    public static func close(_ fd: Int32) {
        if CLibc.close(fd) < 0, errno == EBADF {
            preconditionFailure("close: EBADF: descriptor \(fd) was already closed (our bug)")
        }
    }
}

extension Syscall {
    /// `send(2)` with MSG_NOSIGNAL: a peer that closed turns into EPIPE (thrown) instead of a
    /// SIGPIPE that would kill the gateway.
    public static func send(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws(Errno) -> Int? {
        try call("send") { CLibc.send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL)) }
    }

    /// True if `fd` is a socket (SO_TYPE answers), so `send` with MSG_NOSIGNAL applies.
    public static func isSocket(_ fd: Int32) -> Bool {
        var type: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0
    }
}

extension Syscall {
    /// A `sockaddr_un` for `path` (unix(7)); nil when the path does not fit `sun_path`.
    /// A leading `@` names an abstract socket (a NUL byte instead of the @), as systemd's
    /// $NOTIFY_SOCKET may.
    public static func unixAddress(_ path: String) -> (address: sockaddr_un, length: socklen_t)? {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(path.utf8)
        guard !bytes.isEmpty, bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
        let abstract = bytes[0] == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in for (i, b) in bytes.enumerated() { raw[i] = b } }
        // Abstract names are exactly their bytes; file paths end at the NUL that follows.
        let length = MemoryLayout<sa_family_t>.size + bytes.count + (abstract ? 0 : 1)
        return (address, socklen_t(length))
    }
}
