package shoal;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.datastax.oss.driver.api.core.CqlSession;
import com.datastax.oss.driver.api.core.ProtocolVersion;
import com.datastax.oss.driver.api.core.cql.BatchStatement;
import com.datastax.oss.driver.api.core.cql.DefaultBatchType;
import com.datastax.oss.driver.api.core.cql.PreparedStatement;
import com.datastax.oss.driver.api.core.cql.ResultSet;
import com.datastax.oss.driver.api.core.cql.Row;
import com.datastax.oss.driver.api.core.cql.SimpleStatement;
import com.datastax.oss.driver.api.core.data.CqlVector;
import com.datastax.oss.driver.api.core.servererrors.InvalidQueryException;
import com.datastax.oss.driver.api.core.type.DataType;
import com.datastax.oss.driver.api.core.type.DataTypes;
import com.datastax.oss.driver.api.core.type.VectorType;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The Java driver with default settings against a real shoal process. */
class JavaDriverTest {
  static ShoalProcess shoal;

  @BeforeAll
  static void startShoal() throws Exception {
    shoal = ShoalProcess.start();
  }

  @AfterAll
  static void stopShoal() throws Exception {
    if (shoal != null) {
      shoal.close();
    }
  }

  static CqlSession connect() {
    return CqlSession.builder()
        .addContactPoint(new InetSocketAddress("127.0.0.1", shoal.port))
        .withLocalDatacenter("datacenter1")
        .build();
  }

  @Test
  void connectsNegotiatesV4AndReadsMetadata() {
    try (CqlSession session = connect()) {
      assertEquals(ProtocolVersion.V4, session.getContext().getProtocolVersion());
      Row local = session.execute("SELECT release_version, partitioner FROM system.local").one();
      assertEquals("org.apache.cassandra.dht.Murmur3Partitioner", local.getString("partitioner"));
      session.execute("CREATE KEYSPACE IF NOT EXISTS java_meta WITH replication = "
          + "{'class': 'SimpleStrategy', 'replication_factor': 1}");
      session.execute("CREATE TABLE IF NOT EXISTS java_meta.t (k int PRIMARY KEY, v text)");
      assertTrue(session.checkSchemaAgreement());
      assertTrue(session.getMetadata().getKeyspace("java_meta").flatMap(k -> k.getTable("t")).isPresent());
      assertEquals(1, session.getMetadata().getNodes().size());
    }
  }

  @Test
  void ddlPreparedStatementsBatchesAndPaging() {
    try (CqlSession session = connect()) {
      session.execute("CREATE KEYSPACE IF NOT EXISTS java_ks WITH replication = "
          + "{'class': 'SimpleStrategy', 'replication_factor': 1}");
      session.execute("CREATE TABLE IF NOT EXISTS java_ks.items "
          + "(k int, c int, v text, tags set<text>, attrs map<text, int>, PRIMARY KEY (k, c))");
      assertTrue(session.checkSchemaAgreement());
      PreparedStatement insert =
          session.prepare("INSERT INTO java_ks.items (k, c, v, tags, attrs) VALUES (?, ?, ?, ?, ?)");
      for (int i = 0; i < 120; i++) {
        session.execute(insert.bind(i % 4, i, "v" + i, Set.of("t" + i), Map.of("a", i)));
      }
      PreparedStatement select = session.prepare("SELECT v, tags, attrs FROM java_ks.items WHERE k = ? AND c = ?");
      Row row = session.execute(select.bind(1, 5)).one();
      assertEquals("v5", row.getString("v"));
      assertEquals(Set.of("t5"), row.getSet("tags", String.class));
      assertEquals(Map.of("a", 5), row.getMap("attrs", String.class, Integer.class));

      BatchStatement batch = BatchStatement.newInstance(DefaultBatchType.LOGGED,
          insert.bind(9, 1, "b1", Set.of(), Map.of()),
          SimpleStatement.newInstance("INSERT INTO java_ks.items (k, c, v) VALUES (9, 2, 'b2')"));
      session.execute(batch);
      assertEquals(2, session.execute("SELECT * FROM java_ks.items WHERE k = 9").all().size());

      ResultSet paged = session.execute(
          SimpleStatement.newInstance("SELECT k, c FROM java_ks.items").setPageSize(7));
      List<Integer> seen = new ArrayList<>();
      for (Row r : paged) {
        seen.add(r.getInt("c"));
      }
      assertEquals(122, seen.size());
      // c runs 0..119; the batch added c = 1 and 2 again under k = 9.
      assertEquals(120, seen.stream().distinct().count());
    }
  }

  @Test
  void vectorsRoundTripAndTheSchemaMetadataNamesTheirType() {
    try (CqlSession session = connect()) {
      session.execute("CREATE KEYSPACE IF NOT EXISTS java_vectors WITH replication = "
          + "{'class': 'SimpleStrategy', 'replication_factor': 1}");
      session.execute("CREATE TABLE IF NOT EXISTS java_vectors.items "
          + "(k int PRIMARY KEY, embedding vector<float, 3>, counts vector<bigint, 2>)");
      assertTrue(session.checkSchemaAgreement());
      PreparedStatement insert =
          session.prepare("INSERT INTO java_vectors.items (k, embedding, counts) VALUES (?, ?, ?)");
      session.execute(insert.bind(1, CqlVector.newInstance(0.5f, 1.5f, -2f), CqlVector.newInstance(7L, -9L)));
      Row row = session.execute("SELECT embedding, counts FROM java_vectors.items WHERE k = 1").one();
      assertEquals(CqlVector.newInstance(0.5f, 1.5f, -2f), row.getVector("embedding", Float.class));
      assertEquals(CqlVector.newInstance(7L, -9L), row.getVector("counts", Long.class));
      DataType declared = session.getMetadata().getKeyspace("java_vectors")
          .flatMap(k -> k.getTable("items"))
          .flatMap(t -> t.getColumn("embedding"))
          .map(c -> c.getType())
          .orElseThrow();
      VectorType vector = assertInstanceOf(VectorType.class, declared);
      assertEquals(3, vector.getDimensions());
      assertEquals(DataTypes.FLOAT, vector.getElementType());
    }
  }

  @Test
  void errorsAreReported() {
    try (CqlSession session = connect()) {
      InvalidQueryException error = assertThrows(InvalidQueryException.class,
          () -> session.execute("SELECT * FROM no_such_keyspace.t"));
      assertTrue(error.getMessage().contains("does not exist"));
      assertFalse(session.execute("SELECT key FROM system.local").all().isEmpty());
    }
  }
}
