// StatusCheck: when the gateway asks the broker for its own retained status, and what it does
// with the answer (docs/broker.md "A status the broker did not keep").
import BatonGateway
import BatonLibc
import Testing

struct StatusCheckTests {
    let start = Instant(nanoseconds: 1_000_000_000_000)
    func at(_ seconds: Int) -> Instant { start + .seconds(seconds) }

    /// Asked 5 s after the connect; `online` is the answer wanted, and the next ask is one
    /// `status.interval` later.
    @Test func aKeptStatusIsReadBackEveryInterval() {
        var check = StatusCheck(interval: .seconds(30))
        #expect(check.deadline == nil, "nothing to ask before a connect")
        check.connected(now: start)
        #expect(check.due(now: at(4)) == nil)
        #expect(check.due(now: at(5)) == .ask)
        #expect(check.retained(Array("online".utf8), now: at(5)) == .kept)
        #expect(check.deadline == at(35))
        #expect(check.due(now: at(35)) == .ask)
        #expect(check.retained(Array("online".utf8), now: at(35)) == .kept)
        #expect(check.republishedThisConnection == 0)
    }

    /// The retained status the connect's own subscription brings is from before the birth:
    /// it is not the answer.
    @Test func aRetainedStatusBeforeTheAskIsNoAnswer() {
        var check = StatusCheck(interval: .seconds(30))
        check.connected(now: start)
        #expect(check.retained(Array("offline".utf8), now: at(0)) == nil)
        #expect(check.deadline == at(5))
    }

    /// Nothing within 5 s, or anything but `online`: said again, and asked again after 5, 10,
    /// 20 s, then every interval, so a broker that never keeps it is not asked without end.
    @Test func aLostStatusIsSaidAgainWithBackoff() {
        var check = StatusCheck(interval: .seconds(30))
        check.connected(now: start)
        #expect(check.due(now: at(5)) == .ask)
        #expect(check.due(now: at(9)) == nil)
        #expect(check.due(now: at(10)) == .republish(kept: nil))
        #expect(check.deadline == at(15))
        #expect(check.due(now: at(15)) == .ask)
        #expect(check.retained(Array("offline".utf8), now: at(15)) == .republish(kept: "offline"))
        #expect(check.deadline == at(25))
        #expect(check.due(now: at(25)) == .ask)
        #expect(check.retained([0x6F, 0x00, 0xFF], now: at(25)) == .republish(kept: "o??"), "printable in the log")
        #expect(check.deadline == at(45))
        #expect(check.due(now: at(45)) == .ask)
        #expect(check.due(now: at(50)) == .republish(kept: nil))
        #expect(check.deadline == at(80), "the interval caps the wait")
        #expect(check.republishedThisConnection == 4)
        // Kept at last: the backoff starts over, and a new connect counts anew.
        #expect(check.due(now: at(80)) == .ask)
        #expect(check.retained(Array("online".utf8), now: at(80)) == .kept)
        check.connected(now: at(100))
        #expect(check.republishedThisConnection == 0 && check.deadline == at(105))
        check.disconnected()
        #expect(check.deadline == nil)
    }
}
