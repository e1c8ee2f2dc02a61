// Reconnect backoff with full jitter (docs/broker.md "Reconnect"). Every gateway of a building
// loses the broker at the same moment when it restarts; drawing each wait at random from the
// whole window spreads their reconnects instead of lining them up (the "full jitter" of
// exponential backoff). The window's lower edge stays at `min` so no wait is ever shorter.
import BatonLibc

/// The wait before the next connection attempt: drawn from [min, ceiling], where the ceiling
/// starts at `min`, doubles after every failure up to `max`, and returns to `min` after a
/// successful CONNACK.
///
/// A broker that is simply not there (nothing listens: the connection is refused, or there is
/// no route to it) is tried again within `absentCeiling` however long it has been away and
/// whatever failed before: such an attempt costs one SYN answered by a RST, and the gateways
/// must be back within a second of the broker's return (docs/broker.md "Reconnect").
struct Backoff: Sendable {
    let min: Duration
    let max: Duration
    /// The upper edge of the next draw.
    private(set) var ceiling: Duration

    /// `min` must be positive and `max >= min`; MQTTClient.init checks the configuration.
    init(min: Duration, max: Duration) {
        precondition(min > .zero && max >= min, "Backoff(min: \(min.secondsDescription), max: \(max.secondsDescription)): checked by MQTTClient.init")
        self.min = min
        self.max = max
        self.ceiling = min
    }

    /// The next wait. `fatal` (an error retrying cannot fix by itself: MQTTError.isFatal) skips
    /// the doubling and draws from the widest window at once.
    ///
    /// `absent` (the broker is not there: MQTTError.isBrokerAbsent) draws from
    /// [min, min(ceiling, absentCeiling)] and leaves the ceiling as it is, so a long outage of
    /// refused connections does not push the wait after the broker's return past a second.
    ///
    /// `grow: false` draws from the same window without doubling it: the client's next attempt
    /// goes to another node of the broker, which this failure says nothing about.
    mutating func next(fatal: Bool = false, absent: Bool = false, grow: Bool = true,
                       using rng: inout some RandomNumberGenerator) -> Duration {
        if absent && !fatal {
            let cap = Swift.max(min, Swift.min(ceiling, Self.absentCeiling))
            return .nanoseconds(Int64.random(in: min.nanoseconds...cap.nanoseconds, using: &rng))
        }
        if fatal { ceiling = max }
        let lo = min.nanoseconds
        let hi = ceiling.nanoseconds
        let wait = Duration.nanoseconds(Int64.random(in: lo...hi, using: &rng))
        // Doubling stops at `max`; `max` is at most a day (MQTTClient.init), so `* 2` cannot
        // overflow Duration's 128-bit attoseconds.
        if grow { ceiling = ceiling * 2 > max ? max : ceiling * 2 }
        return wait
    }

    mutating func next(fatal: Bool = false, absent: Bool = false, grow: Bool = true) -> Duration {
        var rng = SystemRandomNumberGenerator()
        return next(fatal: fatal, absent: absent, grow: grow, using: &rng)
    }

    /// The widest window while the broker is absent (unless `min` is larger).
    static let absentCeiling: Duration = .seconds(1)

    mutating func reset() { ceiling = min }
}
