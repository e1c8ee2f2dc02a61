// Drops counted per reason (architecture.md §5.3), in a fixed table: counting never allocates,
// so a flood of bad input cannot grow memory. Reasons are the `WireError.reason` strings,
// which all come from static strings, so there are only as many as the code names.

public struct DropCounts {
    public static let capacity = 48
    @usableFromInline var names: [StaticString]
    @usableFromInline var counts: [Int]
    /// Drops whose reason did not fit the table (never expected: capacity exceeds the
    /// reasons the code declares; counted rather than lost).
    public private(set) var overflow = 0

    public init() {
        names = []
        names.reserveCapacity(Self.capacity)
        counts = []
        counts.reserveCapacity(Self.capacity)
    }

    public var total: Int { counts.reduce(0, +) + overflow }

    public mutating func count(_ error: WireError) { count(error.reasonName) }

    public mutating func count(_ reason: StaticString) { count(reason, 1) }

    /// `times` drops of one reason at once (a batch's records, docs/rooms.md §8.1).
    public mutating func count(_ reason: StaticString, _ times: Int) {
        for i in names.indices where names[i].utf8Start == reason.utf8Start || Malformed(names[i]) == Malformed(reason) {
            counts[i] &+= times
            return
        }
        guard names.count < Self.capacity else { overflow &+= times; return }
        names.append(reason)
        counts.append(times)
    }

    /// (reason, count) pairs, sorted by reason, for printing.
    public var sorted: [(reason: String, count: Int)] {
        var out = zip(names, counts).map { (reason: $0.0.description, count: $0.1) }
        if overflow > 0 { out.append((reason: "other", count: overflow)) }
        return out.sorted { $0.reason < $1.reason }
    }
}

extension WireError {
    /// `reason` as a static string, for counting without allocating.
    public var reasonName: StaticString {
        switch self {
        case .truncated: "truncated"
        case .badLength: "bad-length"
        case .trailing: "trailing-bytes"
        case .unsupported: "unsupported"
        case .malformed(_, let r): r.name
        case .noRoom: "no-room"
        }
    }

    public var reason: String { reasonName.description }
}
