// BatonLibc's `Duration.secondsDescription` (Sources/BatonLibc/Libc.swift): what both builds
// write for a duration in a log line or an answer's detail. In the full build it must read
// exactly as Swift's own `description`, which the firmware does not have.
import BatonLibc
import Testing

@Suite struct DurationDescriptionTests {
    @Test(arguments: [
        Duration.seconds(60), .seconds(5), .seconds(0), .milliseconds(250), .milliseconds(100),
        .milliseconds(1500), .milliseconds(10), .milliseconds(1), .microseconds(100), .seconds(86_400),
        .milliseconds(333), .nanoseconds(123_456_789), .seconds(3_600), .milliseconds(2_750),
    ])
    // From a tenth of a millisecond up (Double writes less with an exponent: "1e-05").
    func readsAsSwiftsOwnDescription(_ d: Duration) {
        #expect(d.secondsDescription == d.description)
    }

    @Test func theConfigDefaultsReadAsTheDocsQuoteThem() {
        // docs/install.md quotes "no advertising report for 60.0 seconds".
        #expect(Duration.seconds(60).secondsDescription == "60.0 seconds")
        #expect(Duration.milliseconds(250).secondsDescription == "0.25 seconds")
    }
}
