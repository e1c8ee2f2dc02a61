// Who speaks for a device the rule does not follow: the gateway its activity topic names
// (docs/relay.md §4 "Who answers"). Slots are RoomOwnership's.
import Testing
import BatonCore

private let kitchen = GatewaySlot(index: 1)
private let office = GatewaySlot(index: 2)
private let phone: UInt64 = 0x5A12_3456_789A
private let laptop: UInt64 = 0x4B00_0000_0001
private let tablet: UInt64 = 0x5A00_0000_0005

@Suite("ActivityPublishers (docs/relay.md §4)")
struct ActivityPublishersTests {
    @Test func theLastMessageNamesThePublisherAndAClearForgetsIt() {
        var p = ActivityPublishers(capacity: 4)
        #expect(p.publisher(of: phone) == nil, "nothing read yet")
        p.published(phone, by: kitchen)
        #expect(p.publisher(of: phone) == kitchen)
        // The phone walks to the office: its new owner publishes it.
        p.published(phone, by: office)
        #expect(p.publisher(of: phone) == office)
        #expect(p.count == 1)
        // Its activity was invalidated: the topic is cleared, nobody speaks for it.
        p.published(phone, by: nil)
        #expect(p.publisher(of: phone) == nil)
        #expect(p.count == 0)
        p.published(laptop, by: nil)
        #expect(p.count == 0, "clearing what was never held holds nothing")
    }

    @Test func aFullStoreKeepsWhatItHoldsAndCountsTheRest() {
        var p = ActivityPublishers(capacity: 2)
        p.published(phone, by: kitchen)
        p.published(laptop, by: office)
        p.published(tablet, by: office)
        #expect(p.publisher(of: tablet) == nil && p.full == 1, "a third device does not fit")
        // A device held changes publisher without taking room.
        p.published(phone, by: office)
        #expect(p.publisher(of: phone) == office && p.full == 1)
        // A clear frees a place.
        p.published(laptop, by: nil)
        p.published(tablet, by: kitchen)
        #expect(p.publisher(of: tablet) == kitchen && p.count == 2 && p.full == 1)
    }
}
