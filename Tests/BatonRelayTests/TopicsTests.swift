// The topic layout (docs/mqtt.md, docs/relay.md §1, §3, §7.1, §9), read both ways: what each
// builder writes, and what `Topics.classify` says a topic heard is. Each test reads like a line
// of the docs: topic strings in, classification out. Anything that is not one of ours, or is
// ours with a malformed level, is `.unknown` or the level's `malformed…`, never a trap.

import Testing
import BatonRelay

/// The gateway `hall` of a building under `baton`.
private let hall = Topics(prefix: "baton", discoveryPrefix: "homeassistant", gatewayID: "hall")
private let device: UInt64 = 0x5A12_3456_789A

struct TopicsTests {
    // MARK: what the builders write

    @Test func mqttMd_theGatewaysTopics() {
        #expect(hall.status == "baton/gateways/hall/status")
        #expect(hall.status(of: "kitchen") == "baton/gateways/kitchen/status")
        #expect(hall.statusPattern == "baton/gateways/+/status")
        #expect(hall.stats == "baton/gateways/hall/stats")
    }

    @Test func mqttMd_activitiesAndAppleDevices_lowercaseHexIDs() {
        #expect(hall.activity(device) == "baton/activities/5a123456789a")
        #expect(hall.activity(0x1) == "baton/activities/000000000001")
        #expect(hall.activityPattern == "baton/activities/+")
        #expect(hall.apple(0x00AB_CDEF) == "baton/apple/00abcdef")
        #expect(hall.applePattern == "baton/apple/+")
    }

    @Test func roomsMd_sightings() {
        #expect(hall.sighting(device) == "baton/sightings/hall/5a123456789a")
        #expect(hall.sightingPattern == "baton/sightings/+/+")
    }

    @Test func roomsMd_sightingBatches() {
        #expect(hall.batch == "baton/rooms/hall")
        #expect(hall.batch(of: "kitchen") == "baton/rooms/kitchen")
        #expect(hall.batchPattern == "baton/rooms/+")
        #expect(hall.buildingBatch == "baton/building/hall")
        #expect(hall.buildingBatchPattern == "baton/building/+")
    }

    /// docs/rooms.md §8: a batch's topic says who sent it and whether it is for the
    /// neighbourhood or the whole building; anything else under those levels is `batch-topic`.
    @Test func roomsMd_whatABatchTopicIs() {
        #expect(hall.classifyBatch("baton/rooms/kitchen") == .neighbourhood(gateway: "kitchen"))
        #expect(hall.classifyBatch(hall.batch) == .neighbourhood(gateway: "hall"))
        #expect(hall.classifyBatch("baton/building/kitchen") == .building(gateway: "kitchen"))
        #expect(hall.classifyBatch("baton/rooms/") == .malformed)
        #expect(hall.classifyBatch("baton/rooms/kitchen/5a123456789a") == .malformed)
        #expect(hall.classifyBatch("baton/building/a/b") == .malformed)
        #expect(hall.classifyBatch("baton/rooms") == nil)
        #expect(hall.classifyBatch("other/rooms/kitchen") == nil)
        #expect(hall.classifyBatch("baton/sightings/kitchen/5a123456789a") == nil)
        // What the gateway's receive switch sees.
        #expect(hall.classify("baton/rooms/kitchen") == .batch(.neighbourhood(gateway: "kitchen")))
        #expect(hall.classify("baton/building/kitchen") == .batch(.building(gateway: "kitchen")))
        #expect(hall.classify("baton/rooms/kitchen/5a123456789a") == .batch(.malformed))
        // Only the building-wide channel has its order checked apart (§8.3).
        #expect(hall.classifyBatch("baton/building/kitchen")?.isBuildingWide == true)
        #expect(hall.classifyBatch("baton/rooms/kitchen")?.isBuildingWide == false)
    }

    @Test func relayMd_fetchesAnswersAndContinued() {
        #expect(hall.fetch(device) == "baton/fetch/5a123456789a")
        #expect(hall.fetchPattern == "baton/fetch/+")
        #expect(hall.answers(to: "baton-fetch-1f") == "baton/answers/baton-fetch-1f")
        #expect(hall.answer(link: 42) == "baton/answers/hall/42")
        #expect(hall.answerPattern == "baton/answers/hall/+")
        #expect(hall.continued(device) == "baton/continued/5a123456789a")
        #expect(hall.continuedPattern == "baton/continued/+")
    }

    @Test func relayMd7_1_streamTopics() {
        #expect(hall.streamOpen(device: device, stream: "tv-1") == "baton/stream/5a123456789a/tv-1")
        #expect(hall.streamOpenPattern == "baton/stream/+/+")
        #expect(hall.stream("tv-1") == StreamTopics(up: "baton/streams/tv-1/up", down: "baton/streams/tv-1/down",
                                                    gateway: "baton/streams/tv-1/gateway"))
        #expect(hall.streamCarrierPattern == "baton/streams/+/gateway")
    }

    @Test func mqttMd4_homeAssistant() {
        #expect(hall.gatewayConnectivityConfig == "homeassistant/binary_sensor/baton_hall/connectivity/config")
        #expect(hall.deviceRoomConfig(device) == "homeassistant/sensor/baton_5a123456789a/room/config")
        #expect(hall.personTrackerConfig(7) == "homeassistant/device_tracker/baton_apple_00000007/tracker/config")
        #expect(hall.tracker(device) == "baton/trackers/5a123456789a")
        #expect(hall.tracker(apple: 7) == "baton/trackers/apple-00000007")
    }

    // MARK: what a topic heard is

    @Test func everyTopicTheGatewaySubscribesTo() {
        #expect(hall.classify("baton/gateways/kitchen/status") == .status(gateway: "kitchen"))
        #expect(hall.classify("baton/gateways/hall/status") == .status(gateway: "hall"), "our own, too")
        #expect(hall.classify("baton/sightings/kitchen/5a123456789a") == .sighting(gateway: "kitchen", device: device))
        #expect(hall.classify("baton/fetch/5a123456789a") == .fetch(device: device))
        #expect(hall.classify("baton/stream/5a123456789a/tv-1") == .streamOpen(device: device, stream: "tv-1"))
        #expect(hall.classify("baton/streams/tv-1/up") == .streamUp(stream: "tv-1"))
        #expect(hall.classify("baton/streams/tv-1/down") == .streamDown(stream: "tv-1"))
        #expect(hall.classify("baton/streams/tv-1/gateway") == .streamCarrier(stream: "tv-1"))
        #expect(hall.classify("baton/answers/hall/42") == .answer(link: 42))
        #expect(hall.classify("baton/activities/5a123456789a") == .activity(device: device))
        #expect(hall.classify("baton/apple/00abcdef") == .apple(0x00AB_CDEF))
        #expect(hall.classify("baton/continued/5a123456789a") == .continued(device: device))
    }

    @Test func whatTheBuildersWriteClassifiesBack() {
        #expect(hall.classify(hall.status) == .status(gateway: "hall"))
        #expect(hall.classify(hall.sighting(device)) == .sighting(gateway: "hall", device: device))
        #expect(hall.classify(hall.fetch(device)) == .fetch(device: device))
        #expect(hall.classify(hall.answer(link: UInt64.max)) == .answer(link: UInt64.max))
        #expect(hall.classify(hall.continued(device)) == .continued(device: device))
        #expect(hall.classify(hall.streamOpen(device: device, stream: "a")) == .streamOpen(device: device, stream: "a"))
        #expect(hall.classify(hall.stream("a").up) == .streamUp(stream: "a"))
        #expect(hall.classify(hall.stream("a").down) == .streamDown(stream: "a"))
        #expect(hall.classify(hall.stream("a").gateway) == .streamCarrier(stream: "a"))
        #expect(hall.classify(hall.activity(0)) == .activity(device: 0))
        #expect(hall.classify(hall.apple(UInt32.max)) == .apple(UInt32.max))
    }

    @Test func aPrefixOfSeveralLevels() {
        let site = Topics(prefix: "site/baton", discoveryPrefix: "homeassistant", gatewayID: "hall")
        #expect(site.classify("site/baton/activities/5a123456789a") == .activity(device: device))
        #expect(site.classify("baton/activities/5a123456789a") == .unknown)
        #expect(hall.classify("site/baton/activities/5a123456789a") == .unknown)
    }

    // MARK: a topic that could be two things: the well-formed one wins within its level

    /// The old chain tried `…/streams/S/up`, `/down` and `/gateway` before "anything else under
    /// the stream topics", which is dropped as `stream-topic`.
    @Test func relayMd7_1_underTheStreamTopicsButNoStreamTopic() {
        #expect(hall.classify("baton/streams/tv-1/sideways") == .malformedStream)
        #expect(hall.classify("baton/streams/TV/up") == .malformedStream, "an id breaks §7.1: not a frame")
        #expect(hall.classify("baton/streams/a/b/up") == .malformedStream)
        #expect(hall.classify("baton/streams//up") == .malformedStream)
        #expect(hall.classify("baton/streams/" + String(repeating: "a", count: 33) + "/up") == .malformedStream)
        #expect(hall.classify("baton/streams/" + String(repeating: "a", count: 32) + "/up")
                == .streamUp(stream: String(repeating: "a", count: 32)))
        #expect(hall.classify("baton/streams/") == .malformedStream)
        #expect(hall.classify("baton/streams/up") == .malformedStream)
        #expect(hall.classify("baton/stream/5a123456789a") == .malformedStream)
        #expect(hall.classify("baton/stream/5a123456789a/") == .malformedStream)
        #expect(hall.classify("baton/stream/5a123456789a/a/b") == .malformedStream)
        #expect(hall.classify("baton/stream/") == .malformedStream)
    }

    /// Leaf names are stream ids too: the last level says which frame it is.
    @Test func relayMd7_1_aStreamNamedLikeALeaf() {
        #expect(hall.classify("baton/streams/up/down") == .streamDown(stream: "up"))
        #expect(hall.classify("baton/streams/gateway/up") == .streamUp(stream: "gateway"))
    }

    /// An open whose device level is not a device id is still an open: it is refused (an error
    /// frame back), not ignored (docs/relay.md §7.2).
    @Test func relayMd7_2_anOpenForNoDeviceIsStillAnOpen() {
        #expect(hall.classify("baton/stream/5A123456789A/tv-1") == .streamOpen(device: nil, stream: "tv-1"))
        #expect(hall.classify("baton/stream//tv-1") == .streamOpen(device: nil, stream: "tv-1"))
    }

    /// Anything under `<prefix>/fetch/` is a request: one without a device id is answered
    /// `bad-request` (docs/relay.md §3), so it must not fall through to "ignored".
    @Test func relayMd3_aFetchForNoDeviceIsStillAFetch() {
        #expect(hall.classify("baton/fetch/5A123456789A") == .fetch(device: nil))
        #expect(hall.classify("baton/fetch/5a123456789a/more") == .fetch(device: nil))
        #expect(hall.classify("baton/fetch/") == .fetch(device: nil))
        #expect(hall.classify("baton/fetch/5a12345678") == .fetch(device: nil))
    }

    /// Under the sightings but not `<gateway>/<12 lowercase hex digits>`: dropped as
    /// `sighting-topic` (docs/rooms.md §5).
    @Test func roomsMd5_underTheSightingsButNoSighting() {
        #expect(hall.classify("baton/sightings/kitchen/5A123456789A") == .malformedSighting)
        #expect(hall.classify("baton/sightings/kitchen") == .malformedSighting)
        #expect(hall.classify("baton/sightings//5a123456789a") == .malformedSighting)
        #expect(hall.classify("baton/sightings/a/b/5a123456789a") == .malformedSighting)
        #expect(hall.classify("baton/sightings/") == .malformedSighting)
    }

    /// Only this gateway's answers are its links': another gateway's are not ours to read.
    @Test func relayMd9_onlyThisGatewaysAnswers() {
        #expect(hall.classify("baton/answers/kitchen/42") == .unknown)
        #expect(hall.classify("baton/answers/hallway/42") == .unknown)
        #expect(hall.classify("baton/answers/hall") == .unknown)
        #expect(hall.classify("baton/answers/hall/x") == .answer(link: nil), "ours, unmatched: counted, not ignored")
        #expect(hall.classify("baton/answers/hall/") == .answer(link: nil))
        #expect(hall.classify("baton/answers/baton-fetch-1f") == .unknown)
        #expect(Topics(prefix: "baton").classify("baton/answers//42") == .unknown, "a client has no answers of a gateway's")
    }

    // MARK: foreign and malformed topics

    @Test func aStatusIsOneGatewayLevel() {
        #expect(hall.classify("baton/gateways/a/b/status") == .unknown)
        #expect(hall.classify("baton/gateways//status") == .unknown)
        #expect(hall.classify("baton/gateways/hall/stats") == .unknown)
        #expect(hall.classify("baton/gateways/status") == .unknown)
    }

    @Test func idsAreExactlyTheirLowercaseHexDigits() {
        #expect(hall.classify("baton/activities/5A123456789A") == .unknown)
        #expect(hall.classify("baton/activities/5a123456789") == .unknown)
        #expect(hall.classify("baton/activities/5a123456789ab") == .unknown)
        #expect(hall.classify("baton/activities/5a12345678 a") == .unknown)
        #expect(hall.classify("baton/activities/+5a12345678a") == .unknown)
        #expect(hall.classify("baton/activities/5a123456789a/x") == .unknown)
        #expect(hall.classify("baton/activities/５a123456789a") == .unknown, "a fullwidth digit")
        #expect(hall.classify("baton/apple/00ABCDEF") == .unknown)
        #expect(hall.classify("baton/apple/abcdef") == .unknown)
        #expect(hall.classify("baton/continued/xyz") == .unknown)
    }

    @Test func foreignTopicsAreUnknown() {
        for topic in ["", "/", "//", "baton", "baton/", "baton//", "baton/activities", "batonx/activities/5a123456789a",
                      "bato/activities/5a123456789a", "/baton/activities/5a123456789a", "homeassistant/status",
                      "baton/trackers/5a123456789a", "baton/unknown/level", "baton/#", "baton/+/status",
                      "ba\u{301}ton/activities/5a123456789a", "baton\u{301}/activities/5a123456789a",
                      "baton/activities\u{301}/5a123456789a", "\u{0}", String(repeating: "/", count: 1000)] {
            #expect(hall.classify(topic) == .unknown, "\(topic)")
        }
    }

    @Test func anyStringIsClassifiedWithoutATrap() {
        // Every topic built from these levels, up to four deep: classify is total.
        let levels = ["", "baton", "streams", "stream", "sightings", "gateways", "fetch", "answers", "hall", "status",
                      "up", "5a123456789a", "00abcdef", "tv-1", "é", "\u{0}"]
        var seen = 0
        for a in levels {
            for b in levels {
                for c in levels {
                    _ = hall.classify("\(a)/\(b)/\(c)")
                    for d in ["", "up", "5a123456789a", "42"] { _ = hall.classify("\(a)/\(b)/\(c)/\(d)"); seen += 1 }
                }
            }
        }
        #expect(seen == levels.count * levels.count * levels.count * 4)
    }
}
