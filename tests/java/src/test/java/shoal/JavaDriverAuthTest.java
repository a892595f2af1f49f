package shoal;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.datastax.oss.driver.api.core.AllNodesFailedException;
import com.datastax.oss.driver.api.core.CqlSession;
import com.datastax.oss.driver.api.core.auth.AuthenticationException;
import com.datastax.oss.driver.api.core.servererrors.UnauthorizedException;
import java.net.InetSocketAddress;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The Java driver's plain-text login against `shoal server --auth`. */
class JavaDriverAuthTest {
  static ShoalProcess shoal;

  @BeforeAll
  static void startShoal() throws Exception {
    shoal = ShoalProcess.start("--auth");
  }

  @AfterAll
  static void stopShoal() throws Exception {
    if (shoal != null) {
      shoal.close();
    }
  }

  static CqlSession login(String user, String password) {
    return CqlSession.builder()
        .addContactPoint(new InetSocketAddress("127.0.0.1", shoal.port))
        .withLocalDatacenter("datacenter1")
        .withAuthCredentials(user, password)
        .build();
  }

  @Test
  void logsInWithAPasswordAndIsHeldToItsPermissions() {
    AllNodesFailedException refused =
        assertThrows(AllNodesFailedException.class, () -> login("cassandra", "wrong"));
    assertTrue(refused.getAllErrors().values().stream().flatMap(errors -> errors.stream())
        .anyMatch(error -> error instanceof AuthenticationException));
    try (CqlSession admin = login("cassandra", "cassandra")) {
      admin.execute("CREATE KEYSPACE java_auth WITH replication = "
          + "{'class': 'SimpleStrategy', 'replication_factor': 1}");
      admin.execute("CREATE TABLE java_auth.t (k int PRIMARY KEY, v int)");
      admin.execute("INSERT INTO java_auth.t (k, v) VALUES (1, 1)");
      admin.execute("CREATE ROLE java_app WITH PASSWORD = 'app-pw' AND LOGIN = true");
      try (CqlSession app = login("java_app", "app-pw")) {
        UnauthorizedException error = assertThrows(UnauthorizedException.class,
            () -> app.execute("SELECT v FROM java_auth.t WHERE k = 1"));
        assertTrue(error.getMessage().contains("no SELECT permission"));
        admin.execute("GRANT SELECT ON java_auth.t TO java_app");
        assertEquals(1, app.execute("SELECT v FROM java_auth.t WHERE k = 1").one().getInt("v"));
      }
    }
  }
}
