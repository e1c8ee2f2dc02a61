// The loop driver (docs/architecture.md "The loop"). Every part of the gateway has the same
// shape: descriptors to poll, a next deadline, work to do when one of them is ready or the
// deadline has passed. The driver owns what they share: one pollfd array, reserved once, split
// into one range per part; the timeout, the nearest of every part's deadline; and, after
// poll(2), which parts are due. The parts' work stays theirs: the caller dispatches on
// `due(_:)`, with each part's own arguments.
public import CLibc

/// One part of the loop: what it polls and when it next has work without a descriptor.
public protocol LoopPart: ~Copyable {
    /// Appends this turn's descriptors: at most `descriptorLimit`, so the array the loop was
    /// sized with never grows.
    mutating func pollDescriptors(into fds: inout [pollfd])
    /// The most descriptors it appends in any turn: what the loop is sized with, stated by the
    /// part that knows, and checked by `PollLoop.add` every turn.
    var descriptorLimit: Int { get }
    /// When it next has work even if no descriptor becomes ready; nil for none.
    var nextDeadline: Instant? { get }
}

/// A part's place in one turn: its descriptors and its deadline. Handed out by `add` in
/// the order the parts are added, which is the same every turn.
public struct LoopSlot: Sendable, Equatable {
    @usableFromInline let index: Int
}

public struct PollLoop: ~Copyable {
    /// This turn's descriptors, every part's range in `add` order.
    public private(set) var fds: [pollfd]
    @usableFromInline var ranges: [Range<Int>]
    @usableFromInline var deadlines: [Instant?]
    /// The longest a turn waits: what libmosquitto's housekeeping wants at least.
    public let longestWait: Duration
    public private(set) var now: Instant
    /// Turns taken, for the stats topic.
    public private(set) var turns = 0
    /// Waits poll(2) failed (EINTR aside), and the errno of the last: a loop that fails every
    /// wait wakes for nothing, so the gateway says the first.
    public private(set) var failedWaits = 0
    public private(set) var lastFailure: Int32 = 0
    /// What `init` sized a turn for: more parts, more descriptors, or a part appending more
    /// than its `descriptorLimit`, is our bug (the arrays grow inside the loop, an allocation
    /// per growth), so it is counted, once per turn, for the owner to say (`oversizedTurns`).
    public let partLimit: Int, descriptorLimit: Int
    /// Turns that outgrew `partLimit` or `descriptorLimit`, or had a part append more than its
    /// own `descriptorLimit`: 0 in a loop sized right.
    public private(set) var oversizedTurns = 0
    /// This turn has been counted in `oversizedTurns`.
    @usableFromInline var oversized = false

    /// `parts` and `descriptors` bound one turn: both arrays are reserved here and only
    /// emptied afterwards, so a turn allocates nothing.
    public init(parts: Int, descriptors: Int, longestWait: Duration = .seconds(1), now: Instant = .now) {
        partLimit = parts
        descriptorLimit = descriptors
        fds = []
        fds.reserveCapacity(descriptors)
        ranges = []
        ranges.reserveCapacity(parts)
        deadlines = []
        deadlines.reserveCapacity(parts)
        self.longestWait = longestWait
        self.now = now
    }

    /// The parts added this turn.
    public var parts: Int { ranges.count }

    /// Starts a turn: forgets the last turn's parts.
    public mutating func begin(now: Instant) {
        self.now = now
        oversized = false
        fds.removeAll(keepingCapacity: true)
        ranges.removeAll(keepingCapacity: true)
        deadlines.removeAll(keepingCapacity: true)
    }

    /// Adds a part: its descriptors and deadline.
    @discardableResult
    public mutating func add<Part: LoopPart & ~Copyable>(_ part: inout Part) -> LoopSlot {
        let start = fds.count
        part.pollDescriptors(into: &fds)
        if fds.count - start > part.descriptorLimit { outgrew() }
        return record(start, part.nextDeadline)
    }

    /// Adds a part of one descriptor (negative: not polled this turn, as poll(2) reads it)
    /// and a deadline.
    @discardableResult
    public mutating func add(fd: Int32, events: Int16 = Int16(POLLIN), deadline: Instant? = nil) -> LoopSlot {
        let start = fds.count
        fds.append(pollfd(fd: fd, events: events, revents: 0))
        return record(start, deadline)
    }

    /// Adds a part that only has a deadline (a timer).
    @discardableResult
    public mutating func add(deadline: Instant?) -> LoopSlot {
        record(fds.count, deadline)
    }

    @usableFromInline
    mutating func record(_ start: Int, _ deadline: Instant?) -> LoopSlot {
        if ranges.count == partLimit || fds.count > descriptorLimit { outgrew() }
        ranges.append(start..<fds.count)
        deadlines.append(deadline)
        return LoopSlot(index: ranges.count - 1)
    }

    @usableFromInline
    mutating func outgrew() {
        if !oversized { oversizedTurns += 1 }
        oversized = true
    }

    /// Milliseconds to the nearest deadline, at most `longestWait`, rounded up: waking a hair
    /// early would spin a turn for nothing.
    public var timeout: Int32 {
        var next = now + longestWait
        for case let d? in deadlines where d < next { next = d }
        return (next - now).pollMilliseconds()
    }

    /// Waits in poll(2) until a descriptor is ready or the nearest deadline, and reads the
    /// clock again. EINTR (a signal) is just an early turn.
    @discardableResult
    public mutating func wait() -> Instant {
        let timeout = self.timeout
        let ready = fds.withUnsafeMutableBufferPointer { CLibc.poll($0.baseAddress, nfds_t($0.count), timeout) }
        if ready < 0 {
            // Not `Syscall.call`: an EINTR is not retried but returned as a turn with nothing
            // ready, so a signal's handler (which writes the stop pipe) is seen at once and no
            // deadline waits out a second poll. EFAULT is our bug. ENOMEM, and EINVAL (more
            // entries than RLIMIT_NOFILE, which the largest relay capacities can reach) pass
            // as an empty turn, never a trap on what the config allowed.
            let failure = errno
            precondition(failure != EFAULT, "poll: EFAULT with \(fds.count) descriptors (our bug)")
            if failure != EINTR {
                failedWaits &+= 1
                lastFailure = failure
            }
            for i in fds.indices { fds[i].revents = 0 }
        }
        now = .now
        turns &+= 1
        return now
    }

    /// Keeps a part's descriptors out of this turn's poll(2) until `until`, which becomes its
    /// deadline: what they deliver meanwhile waits in the kernel and is read in one turn when
    /// it is due (docs/architecture.md §2 "Gathering"). The other parts are polled as ever.
    /// poll(2) skips a negative descriptor (`ready` then shows it complemented). Returns
    /// whether a descriptor was held back: the part should then read it once the hold ends.
    @discardableResult
    public mutating func holdBack(_ slot: LoopSlot, until: Instant) -> Bool {
        guard until > now else { return false }
        var held = false
        for i in ranges[slot.index] where fds[i].fd >= 0 {
            fds[i].fd = ~fds[i].fd
            held = true
        }
        if held { deadlines[slot.index] = min(deadlines[slot.index] ?? until, until) }
        return held
    }

    /// What poll(2) said of a part's descriptors, in the order the part appended them.
    public func ready(_ slot: LoopSlot) -> ArraySlice<pollfd> { fds[ranges[slot.index]] }

    /// Whether any of the part's descriptors is ready.
    public func isReady(_ slot: LoopSlot) -> Bool {
        for fd in fds[ranges[slot.index]] where fd.revents != 0 { return true }
        return false
    }

    /// Whether the part's deadline has passed.
    public func isDue(_ slot: LoopSlot) -> Bool {
        guard let d = deadlines[slot.index] else { return false }
        return d <= now
    }

    /// Ready or due: the part has work this turn.
    public func hasWork(_ slot: LoopSlot) -> Bool { isReady(slot) || isDue(slot) }
}

/// Descriptors gathered by hand, as one part: a peer's sockets, a test's far ends of links.
public struct DescriptorList: LoopPart {
    public var fds: [pollfd]
    public var deadline: Instant?
    public init(_ fds: [pollfd] = [], deadline: Instant? = nil) {
        self.fds = fds
        self.deadline = deadline
    }
    public mutating func pollDescriptors(into all: inout [pollfd]) { all.append(contentsOf: fds) }
    public var descriptorLimit: Int { fds.count }
    public var nextDeadline: Instant? { deadline }
}
