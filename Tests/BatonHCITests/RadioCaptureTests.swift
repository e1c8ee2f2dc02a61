// Capture replay as a radio source (docs/radio.md "Capture replay"): the same events a
// controller would send, as fast as possible or at the capture's pace, driven by deadlines.
import BatonLibc
import Testing
import BatonTestSupport
import BatonSim
import BatonWire
@testable import BatonHCI

private func replay(_ file: [UInt8], pace: RadioCapture.Pace = .asFastAsPossible) throws -> RadioCapture {
    try RadioCapture(file: file, pace: pace)
}

private func drain(_ radio: inout RadioCapture, now: Instant) throws -> [[UInt8]] {
    var events: [[UInt8]] = []
    _ = try radio.poll(now: now) { events.append(Array($0)) }
    return events
}

@Suite struct RadioCaptureTests {
    @Test func sniffedAdvertisingPDUsBecomeTheEventsAControllerSends() throws {
        var radio = try replay(PCAPTests.leLLFile)
        let t0 = Instant.now
        try radio.start(now: t0)
        let events = try drain(&radio, now: t0)
        // ADV_IND from random C0:11:22:33:44:55 at -60 dBm, 16 bytes of AD, as the LE
        // Advertising Report a controller sends (Core 5.4, Vol 4, Part E, §7.7.65.2).
        #expect(events.first == hx("3E 1C 02 01 00 01 554433 2211C0 10 02010606094261746f6e0516d2fc4000 C4"))
        #expect(radio.malformedRecords == 1, "the last PDU's CRC is bad")
        #expect(radio.state == .finished)
        var decoder = AdvertisementDecoder()
        for e in events { e.withUnsafeBytes { decoder.decode(event: $0, timestamp: 0) { _ in } } }
        #expect(events.count == 3, "ADV_IND, ADV_NONCONN_IND, ADV_DIRECT_IND; the bad-CRC PDU is not delivered")
        #expect(decoder.tally.reports == 3)
        // The ADV_NONCONN_IND carries Apple's company id with nothing after it.
        #expect(decoder.tally.drops.sorted.map { "\($0.reason) \($0.count)" } == ["continuity-empty 1"])
    }

    @Test func fastReplayDeliversEveryReportInBoundedBatches() throws {
        var g = CaptureGenerator(devices: 10, seed: 2)
        let (file, written) = g.capture(reports: 1_000)
        var radio = try replay(file)
        #expect(radio.fd == -1 && radio.state == .stopped)
        let now = Instant.now
        try radio.start(now: now)
        var decoder = AdvertisementDecoder()
        var polls = 0
        while radio.state == .scanning {
            let n = try radio.poll(now: now) { e in decoder.decode(event: e, timestamp: 0) { _ in } }
            #expect(n <= RadioCapture.batch, "one poll never monopolises the loop")
            polls += 1
        }
        #expect(decoder.tally.reports == written.count)
        #expect(decoder.tally.drops.total == 0)
        #expect(polls > 1)
        #expect(radio.nextDeadline == nil, "a finished replay has no deadline")
    }

    @Test func pacedReplayDeliversEachRecordAtItsTime() throws {
        var g = CaptureGenerator(devices: 4, seed: 9)
        let (file, written) = g.capture(reports: 40)
        var radio = try replay(file, pace: .timestamps(speed: 2))
        let t0 = Instant.now
        try radio.start(now: t0)
        var delivered = try drain(&radio, now: t0).count
        #expect(delivered == 1, "only the first event is due at the start")
        // Walk the clock from deadline to deadline: each one releases the next event(s).
        var steps = 0
        while radio.state == .scanning, let due = radio.nextDeadline, steps < 100 {
            #expect(try drain(&radio, now: due - .microseconds(1)).isEmpty, "nothing before its time")
            delivered += try drain(&radio, now: due).count
            steps += 1
        }
        #expect(radio.state == .finished)
        // At speed 2, the last deadline is half the capture's span after the start.
        let span = written.last!.timestamp - written.first!.timestamp
        #expect(steps >= 1 && delivered >= 10)
        #expect(span > 0)
    }

    @Test func aDamagedCaptureReplaysWhatCameBeforeAndSaysWhere() throws {
        var g = CaptureGenerator(devices: 4, seed: 4)
        let (file, _) = g.capture(reports: 100)
        var radio = try replay(Array(file.dropLast(5)))
        let now = Instant.now
        try radio.start(now: now)
        var events = 0
        while radio.state == .scanning { events += try radio.poll(now: now) { _ in } }
        #expect(events > 0)
        guard case .truncated(let at, _)? = radio.damage else {
            Issue.record("expected a truncation, got \(String(describing: radio.damage))")
            return
        }
        #expect(at > 16 && at < file.count)
        // start() rewinds: the same events come again.
        try radio.start(now: now)
        var again = 0
        while radio.state == .scanning { again += try radio.poll(now: now) { _ in } }
        #expect(again == events)
    }

    @Test func notACaptureIsAWireError() {
        #expect(throws: RadioError.self) { _ = try replay(Array("not a capture".utf8)) }
    }
}
