// The gateway's loop for the tests (docs/architecture.md §2): the same driver, PollLoop,
// turned as `Gateway.turn` turns it (every part added, one wait, every part served), until
// what the test waits for holds or its bound passes. A test says only which parts it has and
// how it serves them.
import BatonLibc

public struct TestLoop: ~Copyable {
    public private(set) var driver: PollLoop

    /// `parts` and `descriptors` as the gateway sizes its driver; the bound's deadline is one
    /// more part.
    public init(parts: Int = 8, descriptors: Int = 64, longestWait: Duration = .seconds(1)) {
        driver = PollLoop(parts: parts + 1, descriptors: descriptors, longestWait: longestWait)
    }

    /// Turns until `done()` holds (true) or `limit` of the clock has passed (false). Each turn
    /// runs `before` (a test's far ends read what came), asks `done`, then `turn` adds the
    /// parts to the driver, calls its `wait()` and serves them. The bound is a deadline of the
    /// driver's, so a turn never waits past it.
    @discardableResult
    public mutating func run(limit: Duration, before: () throws -> Void, until done: () -> Bool,
                             _ turn: (inout PollLoop) throws -> Void) rethrows -> Bool {
        let end = Instant.now + limit
        while true {
            try before()
            if done() { return true }
            let now = Instant.now
            if now >= end { return false }
            driver.begin(now: now)
            driver.add(deadline: end)
            try turn(&driver)
        }
    }

    /// `run` with nothing before each turn.
    @discardableResult
    public mutating func run(limit: Duration, until done: () -> Bool, _ turn: (inout PollLoop) throws -> Void) rethrows -> Bool {
        try run(limit: limit, before: {}, until: done, turn)
    }

    /// `count` turns, each served by `turn` as in `run`, waiting at most `longestWait` each;
    /// each begins at `now` (a test's injected time; default: the clock).
    public mutating func turns(_ count: Int, now: Instant? = nil, _ turn: (inout PollLoop) -> Void) {
        for _ in 0..<count {
            driver.begin(now: now ?? .now)
            turn(&driver)
        }
    }
}
