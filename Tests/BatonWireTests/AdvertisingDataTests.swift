// AD structures: Core 5.4, Vol 3, Part C, §11.
import BatonTestSupport
import Testing
@testable import BatonWire


private struct Walked: Equatable {
    var type: UInt8
    var data: [UInt8]
}

private func walk(_ bytes: [UInt8]) -> (structures: [Walked], error: WireError?) {
    bytes.withUnsafeBytes { raw in
        var it = ADIterator(raw)
        var out: [Walked] = []
        do throws(WireError) {
            while let ad = try it.next() { out.append(Walked(type: ad.type, data: Array(ad.data))) }
        } catch {
            // After an error the iterator is finished: no endless loop.
            let again = try? it.next()
            #expect(again == nil)
            return (out, error)
        }
        return (out, nil)
    }
}

@Suite struct AdvertisingDataTests {
    @Test func emptyDataHasNoStructures() {
        let r = walk([])
        #expect(r.structures.isEmpty && r.error == nil)
    }

    @Test func flagsNameAndManufacturerData() {
        // Flags 0x06; Complete Local Name "Pi"; manufacturer 0x004C with 2 bytes.
        let r = walk(hx("020106 03 09 5069 05 FF 4C00 1005"))
        #expect(r.error == nil)
        #expect(r.structures == [Walked(type: 0x01, data: [0x06]), Walked(type: 0x09, data: [0x50, 0x69]),
                                 Walked(type: 0xFF, data: [0x4C, 0x00, 0x10, 0x05])])
    }

    @Test func zeroPaddingEndsTheSignificantPart() {
        // §11: the non-significant part "shall contain all-zero octets".
        let r = walk(hx("020106") + [UInt8](repeating: 0, count: 28))
        #expect(r.error == nil && r.structures.count == 1)
    }

    @Test func zeroLengthFollowedByDataIsMalformed() {
        let r = walk(hx("020106 00 0309"))
        #expect(r.structures.count == 1)
        #expect(r.error == .malformed(at: 4, .adZeroLength))
    }

    @Test func overlongLengthIsMalformedNotARead() {
        // The second structure claims 5 bytes and 2 remain.
        let r = walk(hx("020106 05 FF 4C"))
        #expect(r.structures.count == 1)
        #expect(r.error == .malformed(at: 3, .adOverlong))
        #expect(walk([0x01]).error == .malformed(at: 0, .adOverlong), "a length byte with nothing after it")
    }

    @Test func lengthOneIsATypeWithNoData() {
        #expect(walk([0x01, 0x2A]).structures == [Walked(type: 0x2A, data: [])])
    }

    @Test func manufacturerAccessorSplitsTheCompanyID() {
        hx("05 FF 4C00 1005").withUnsafeBytes { raw in
            var it = ADIterator(raw)
            let ad = try! it.next()!
            #expect(ad.manufacturer?.companyID == 0x004C)
            #expect(Array(ad.manufacturer!.value) == [0x10, 0x05])
        }
        hx("02 FF 4C").withUnsafeBytes { raw in
            var it = ADIterator(raw)
            #expect(try! it.next()!.manufacturer == nil, "one byte is not a company id")
        }
    }

    @Test func everyLengthByteTerminates() {
        // Exhaustive over a short tail: any first length byte gives structures or an error, finitely.
        for first in 0...255 {
            let bytes: [UInt8] = [UInt8(first), 0xFF, 0x01, 0x02, 0x03]
            let r = walk(bytes)
            #expect(r.structures.count <= 2)
        }
    }
}
