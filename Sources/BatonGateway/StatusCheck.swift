// Reads this gateway's own retained status back from the broker (docs/broker.md "A status
// the broker did not keep"). A gateway says `online` once per connect; a broker that takes
// the publish but does not store it (nats-server 2.9.10, while its retained-message stream is
// not current: "unable to store retained message … timeout … $MQTT.rmsgs") leaves Home
// Assistant and every gateway started later reading the will's `offline`, or nothing, until
// the next connect. So some seconds after each connect, and every `status.interval` after,
// the gateway subscribes to its own status topic alone: the broker answers a new subscription
// with what it retains there (MQTT 5 §3.3.1.3, 3.1.1 §3.3.1.3), flagged retained. `online`
// is the answer wanted; anything else, or nothing within `answerWithin`, and the birth is
// published again.
import BatonLibc

public struct StatusCheck: Sendable {
    /// What the gateway is to do now.
    public enum Step: Sendable, Equatable {
        /// Subscribe to the own status topic: its retained message is the answer.
        case ask
        /// Unsubscribe again; the broker kept `online`.
        case kept
        /// Unsubscribe, and publish the birth again: the broker kept `retained` (nil: nothing).
        case republish(kept: String?)
    }

    /// After a connect the birth is published first; the broker is asked this much later, so
    /// a broker that stores retained messages on a round trip of its own (NATS: a JetStream
    /// request) has had time to.
    public static let firstAfter: Duration = .seconds(5)
    /// A broker sends the retained message right after SUBACK: none within this, none kept.
    public static let answerWithin: Duration = .seconds(5)

    enum Phase: Sendable, Equatable { case idle, due(Instant), asked(until: Instant) }
    var phase: Phase = .idle
    /// The wait before the next ask after a republish: doubles from `firstAfter` up to
    /// `interval`, so a broker that never keeps it is not asked ten times a minute.
    var retry: Duration = firstAfter
    /// `status.interval`: how often a kept status is read back.
    public let interval: Duration
    /// Republishes since the last connect: the first is a warning, the rest are counted.
    public private(set) var republishedThisConnection = 0

    public init(interval: Duration) { self.interval = interval }

    public var deadline: Instant? {
        switch phase {
        case .idle: nil
        case .due(let at): at
        case .asked(let until): until
        }
    }

    public var isAsking: Bool { if case .asked = phase { true } else { false } }

    public mutating func connected(now: Instant) {
        phase = .due(now + Self.firstAfter)
        retry = Self.firstAfter
        republishedThisConnection = 0
    }

    /// The connection is gone: nothing to ask until the next connect.
    public mutating func disconnected() { phase = .idle }

    /// The step due at `now`, if any.
    public mutating func due(now: Instant) -> Step? {
        switch phase {
        case .due(let at) where at <= now:
            phase = .asked(until: now + Self.answerWithin)
            return .ask
        case .asked(let until) where until <= now:
            return republish(kept: nil, now: now)
        default:
            return nil
        }
    }

    /// A retained message on the own status topic. Only while asking is it the answer: the
    /// one the connect's wildcard subscription brings is from before this connect's birth.
    public mutating func retained(_ payload: [UInt8], now: Instant) -> Step? {
        guard isAsking else { return nil }
        if payload.elementsEqual("online".utf8) {
            phase = .due(now + interval)
            retry = Self.firstAfter
            return .kept
        }
        // For the log: what was kept, printable ASCII only.
        let text = String(decoding: payload.prefix(32).map { $0 >= 0x20 && $0 < 0x7F ? $0 : 0x3F }, as: UTF8.self)
        return republish(kept: text, now: now)
    }

    private mutating func republish(kept: String?, now: Instant) -> Step {
        republishedThisConnection &+= 1
        phase = .due(now + retry)
        retry = min(retry * 2, max(interval, Self.firstAfter))
        return .republish(kept: kept)
    }
}
