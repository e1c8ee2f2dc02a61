// Errors in bytes that came from a peer (errors say whose fault it is: architecture.md §5.3).
// A `WireError` always means "the input is bad"; our own broken invariants are
// `precondition`s, the OS's failures are `Errno`, a controller's are `ControllerError`.

/// A named rule that a peer's bytes broke. Each codec declares its own reasons in its own
/// file (`extension Malformed { static let … }`), so the set grows without one central enum,
/// and a reason's `name` is the key drops are counted under on the stats topic.
public struct Malformed: Hashable, Sendable, CustomStringConvertible {
    public let name: StaticString

    public init(_ name: StaticString) { self.name = name }

    public var description: String { name.description }

    public static func == (a: Malformed, b: Malformed) -> Bool {
        // StaticString has no Equatable; compare the UTF-8 bytes without allocating.
        a.name.withUTF8Buffer { x in b.name.withUTF8Buffer { y in x.elementsEqual(y) } }
    }

    public func hash(into hasher: inout Hasher) {
        name.withUTF8Buffer { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
    }
}

public enum WireError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A read at byte `at` needed `need` more bytes than the input holds.
    case truncated(at: Int, need: Int)
    /// A length field at byte `at` is zero where zero is not allowed, or larger than what
    /// remains (`length`), or smaller than its fixed part.
    case badLength(at: Int, length: Int)
    /// Bytes left over at `at` after a structure that must fill its container exactly.
    case trailing(at: Int, count: Int)
    /// A version, kind or type at `at` that this decoder does not know.
    case unsupported(at: Int, value: UInt64)
    /// A named rule broken at byte `at`.
    case malformed(at: Int, Malformed)
    /// An encoder's output needs `need` bytes and the caller's buffer has `have`.
    case noRoom(need: Int, have: Int)

    public var description: String {
        switch self {
        case .truncated(let at, let need): "truncated at byte \(at): \(need) more byte(s) needed"
        case .badLength(let at, let length): "bad length \(length) at byte \(at)"
        case .trailing(let at, let count): "\(count) trailing byte(s) at byte \(at)"
        case .unsupported(let at, let value): "unsupported value \(value) at byte \(at)"
        case .malformed(let at, let reason): "\(reason) at byte \(at)"
        case .noRoom(let need, let have): "no room: \(need) bytes needed, \(have) available"
        }
    }
}
