// PollLoop.holdBack (docs/architecture.md §2 "Gathering"): a held-back part's descriptors are
// left out of poll(2) until its hold ends, what they deliver meanwhile is read in one turn, and
// the other parts are polled as ever.
import BatonLibc
import CLibc
import Foundation
import Testing

@Suite("Poll loop: gathering")
struct PollLoopGatherTests {
    @Test func whatAHeldBackPartDeliversMeanwhileIsReadInOneTurn() throws {
        var radio: [Int32] = [0, 0]
        #expect(pipe(&radio) == 0)
        defer { close(radio[0]); close(radio[1]) }
        var loop = PollLoop(parts: 1, descriptors: 1)
        // Five reports, 10 ms apart, while the radio is held back for 300 ms.
        let writer = radio[1]
        let thread = Thread { for _ in 0 ..< 5 { _ = write(writer, "r", 1); usleep(10_000) } }
        let start = Instant.now
        loop.begin(now: start)
        let part = loop.add(fd: radio[0])
        let held = loop.holdBack(part, until: start + .milliseconds(300))
        #expect(held)
        thread.start()
        loop.wait()
        let ready = loop.isReady(part), due = loop.isDue(part), turns = loop.turns
        #expect(!ready, "not polled while held back")
        #expect(due, "the hold ending is the part's deadline")
        #expect(turns == 1)
        var buffer = [UInt8](repeating: 0, count: 64)
        #expect(read(radio[0], &buffer, 64) == 5, "one read gets all five")
    }

    @Test func otherPartsArePolledWhileOneIsHeldBack() throws {
        var radio: [Int32] = [0, 0], broker: [Int32] = [0, 0]
        #expect(pipe(&radio) == 0 && pipe(&broker) == 0)
        defer { for fd in radio + broker { close(fd) } }
        #expect(write(radio[1], "r", 1) == 1)
        #expect(write(broker[1], "m", 1) == 1)
        var loop = PollLoop(parts: 3, descriptors: 3)
        let start = Instant.now
        loop.begin(now: start)
        let radioPart = loop.add(fd: radio[0])
        let brokerPart = loop.add(fd: broker[0])
        loop.holdBack(radioPart, until: start + .seconds(60))
        let nothing = loop.add(fd: -1)
        let heldNothing = loop.holdBack(nothing, until: start + .seconds(60))
        #expect(!heldNothing, "a part without a descriptor (a stopped radio) holds nothing back")
        let now = loop.wait()
        let brokerReady = loop.isReady(brokerPart), radioReady = loop.isReady(radioPart), radioDue = loop.isDue(radioPart)
        #expect(brokerReady)
        #expect(!radioReady && !radioDue)
        #expect(now - start < .seconds(30), "woken by the broker, not at the end of the hold")
        // A hold that has ended holds nothing back.
        loop.begin(now: .now)
        let again = loop.add(fd: radio[0])
        let heldAgain = loop.holdBack(again, until: start)
        #expect(!heldAgain)
        loop.wait()
        let readyAgain = loop.isReady(again)
        #expect(readyAgain)
    }
}
